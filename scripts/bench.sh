#!/usr/bin/env bash
# Benchmarks casebatch on the embedded default against `xargs -P` running the same commands.
# Not a test: it prints figures (cases/s, wall-time ratios, peak memory) for the closing note.
#
#   scripts/bench.sh            # all scenarios (about 5 minutes on 2 cores)
#   N=200 scripts/bench.sh      # fewer cases
#   SKIP_10K=1 scripts/bench.sh # without the 10,000-case fake batch
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-601}
C=${C:-64}
BIG=${BIG:-10000}
cargo build --release -q -p casebatch-cli
BIN=$PWD/target/release/casebatch
WORK=$(mktemp -d /tmp/casebatch-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

manifest() { # name runtime harness count concurrency
  local f="$WORK/$1.yaml"
  {
    echo "batch_id: $1"
    echo "defaults:"
    echo "  concurrency: $5"
    echo "  runtime: $2"
    [ -n "$3" ] && echo "  harness: '$3'"
    echo "tasks:"
    for i in $(seq 1 "$4"); do echo "  - task_id: case-$i"; done
  } > "$f"
  echo "$f"
}

now() { date +%s.%N; }
calc() { awk "BEGIN { print $1 }"; }

# Runs a batch; prints wall seconds. Peak RSS of the runner (worker in-process) goes to $WORK/$1.rss.
run_batch() {
  local name=$1 file=$2 t0 t1 pid peak=0 rss
  t0=$(now)
  "$BIN" batch run --manifest "$file" --output-dir "$WORK/out-$name" > "$WORK/$name.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    [ -n "$rss" ] && [ "$rss" -gt "$peak" ] && peak=$rss
    sleep 0.2
  done
  wait "$pid" || { echo "batch $name failed:"; cat "$WORK/$name.log"; exit 1; }
  t1=$(now)
  echo "$peak" > "$WORK/$name.rss"
  calc "$t1 - $t0"
}

xargs_run() { # count concurrency command
  local t0 t1
  t0=$(now)
  seq 1 "$1" | xargs -P "$2" -I{} sh -c "$3"
  t1=$(now)
  calc "$t1 - $t0"
}

report() { # label cases seconds [baseline seconds]
  local rate ratio=""
  rate=$(calc "$2 / $3")
  [ -n "${4:-}" ] && ratio=$(printf " · %.2fx the wall time of xargs -P %s (%.2fs)" "$(calc "$3 / $4")" "$C" "$4")
  printf "%-44s %6d cases in %7.2fs = %7.1f cases/s%s\n" "$1" "$2" "$3" "$rate" "$ratio"
}

echo "casebatch benchmark: N=$N, concurrency $C, $(nproc) cores, embedded dev server"

f=$(manifest trivial local-process 'true' "$N" "$C")
base=$(xargs_run "$N" "$C" 'true')
t=$(run_batch trivial "$f")
report "local-process, trivial command (true)" "$N" "$t" "$base"

f=$(manifest sleep1 local-process 'sleep 1' "$N" "$C")
base=$(xargs_run "$N" "$C" 'sleep 1')
t=$(run_batch sleep1 "$f")
report "local-process, sleep 1" "$N" "$t" "$base"

f=$(manifest fake fake '' "$N" "$C")
t=$(run_batch fake "$f")
report "fake runtime (simulation), no-op" "$N" "$t"

if [ -z "${SKIP_10K:-}" ]; then
  f=$(manifest big fake '' "$BIG" "$C")
  t=$(run_batch big "$f")
  report "fake runtime (simulation), $BIG cases" "$BIG" "$t"
  printf "%-44s %6d MB peak resident (runner + in-process worker)\n" "" "$(( $(cat "$WORK/big.rss") / 1024 ))"
fi
