#!/usr/bin/env python3
"""Reports file-level import circles inside one crate's src/ (exit 1 when there is one).

A file imports another when it names a path inside it: `crate::a::b`, `super::x`, or a child
module it declares (`mod x;` then `x::...`). Test modules inside a file count as the file.
Usage: import-cycles.py CRATE_DIR [CRATE_DIR ...]
"""
import re
import sys
from pathlib import Path


def modules(src: Path) -> dict[tuple, Path]:
    """Module path (a tuple of names) -> the file that holds it."""
    found = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        found[tuple(parts)] = f
    return found


def resolve(path: tuple, known: dict) -> tuple | None:
    """The longest prefix of `path` that is a module file."""
    for n in range(len(path), -1, -1):
        if path[:n] in known:
            return path[:n]
    return None


# Comments, string literals (raw ones too) and char literals, matched in one pass so that a
# `//` inside a string ("http://...") is not taken for a comment, nor a `"` in a char for a
# string.
TOKENS = re.compile(
    r"//[^\n]*"
    r"|/\*.*?\*/"
    r"|(?<![\w])b?r(#*)\".*?\"\1"
    r"|(?<![\w])b?\"(?:\\.|[^\"\\])*\""
    r"|'(?:\\[^']{1,10}|[^'\\\n])'",
    re.S,
)


def strip_comments(text: str) -> str:
    """The text without comments, and with every string and char literal emptied."""
    return TOKENS.sub(lambda m: " " if m.group(0).startswith("/") else '""', text)


def edges(known: dict) -> dict[tuple, set]:
    graph = {m: set() for m in known}
    for mod, f in known.items():
        text = strip_comments(f.read_text())
        children = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M))
        targets = []
        for m in re.finditer(r"\bcrate((?:::\w+)+)", text):
            targets.append(tuple(m.group(1).split("::")[1:]))
        for m in re.finditer(r"\bsuper((?:::\w+)+)", text):
            # Inside a file-level module, `super` is the parent file's module.
            targets.append(mod[:-1] + tuple(m.group(1).split("::")[1:]))
        for m in re.finditer(r"(?<![:\w])(\w+)((?:::\w+)+)", text):
            if m.group(1) in children:
                targets.append(mod + (m.group(1),) + tuple(m.group(2).split("::")[1:]))
        # `use super::{a, b}` and `use crate::{a, b}` groups.
        for m in re.finditer(r"\b(crate|super)::\{([^}]*)\}", text):
            base = () if m.group(1) == "crate" else mod[:-1]
            for name in re.findall(r"(\w+)", m.group(2)):
                targets.append(base + (name,))
        for t in targets:
            r = resolve(t, known)
            if r is not None and r != mod and r != ():
                graph[mod].add(r)
    return graph


def cycles(graph: dict) -> list[list]:
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main() -> int:
    bad = 0
    for crate in sys.argv[1:]:
        src = Path(crate) / "src"
        known = modules(src)
        for comp in cycles(edges(known)):
            bad += 1
            names = sorted(str(known[m].relative_to(crate)) for m in comp)
            print(f"{crate}: import circle: {' <-> '.join(names)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
