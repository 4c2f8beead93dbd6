#!/usr/bin/env python3
"""Prints what attempts' journals (`attempts/<n>/attempt.jsonl`) record of one kind.

    scripts/journal.py KIND ATTEMPT_DIR...

One JSON line per attempt directory that has an entry of KIND (`job`, `record`, `cleanup`,
`prepared`, ...): the last one, as casebatch reads it. For the drill and history scripts,
which read bundles from the shell.
"""
import json
import os
import sys


def last_of(kind, attempt_dir):
    found = None
    try:
        with open(os.path.join(attempt_dir, "attempt.jsonl"), encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # a write cut short
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if kind in entry:
                    found = entry[kind]
    except FileNotFoundError:
        pass
    return found


def main():
    kind, dirs = sys.argv[1], sys.argv[2:]
    for d in dirs:
        value = last_of(kind, d)
        if value is not None:
            print(json.dumps(value))


if __name__ == "__main__":
    main()
