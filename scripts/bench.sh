#!/usr/bin/env bash
# Benchmarks casebatch on the embedded default against `xargs -P` running the same commands,
# measured in the same run. Not a test: it prints figures for the closing note. Every scenario
# runs RUNS times (default 3) and the median is reported: these machines are noisy.
#
#   scripts/bench.sh            # all scenarios
#   N=200 scripts/bench.sh      # fewer cases
#   SKIP_10K=1 scripts/bench.sh # without the 10,000-case fake batch
#   ONLY=agent scripts/bench.sh # only the agent-vs-local-process comparison
#   ONLY=tail scripts/bench.sh  # only the uniform-vs-weighted split over a fast and a slow agent
#   CASEBATCH_BIN=path scripts/bench.sh # measure that binary instead of building this tree
#   ONLY=local scripts/bench.sh # only the local-process cost per case (sleep 1, true, 256 wide;
#                               # WIDE=1 adds 2,048 x sleep 10 at 512), on an aged file system
#                               # and on a fresh one (see `round_fs`; FS=aged or FS=fresh for one;
#                               # FS=journaled: a new ext4 with a journal, aged)
#   ONLY=wide scripts/bench.sh  # only 2,048 x sleep 10 at 512 (about four minutes a round)
#   ONLY=prepare scripts/bench.sh # only provision-ahead against provisioning at dispatch
#   ONLY=policies scripts/bench.sh # only sleep 1 reporting usage: no policy, a budget, budget + pace
#   ONLY=aged scripts/bench.sh  # only an agent with 300,000 ended jobs against a fresh one
#   ONLY=huge scripts/bench.sh  # only 100,000 simulated cases (HUGE=N): completes, peak RSS,
#                               # `batch status` every 5 s during the run (median, slowest)
#   ONLY=shared scripts/bench.sh # only one agent of 8 slots shared by two users: 200 x sleep 2
#                               # at 64 alone, then with 16 x sleep 2 at 8 from another user
#                               # (shares, completion, slot utilization; fair share, issue 59)
#   ONLY=slurm scripts/bench.sh # only 300 x sleep 1 at 32 through a Slurm runtime against xargs -P 32
#                               # of `sbatch --wait`, on a one-node cluster of the bench's own
#                               # (scripts/slurm-cluster.sh; Slurm calls per case counted)
#   ONLY=containers scripts/bench.sh # only 200 x true in containers against podman run (needs
#                               # DOCKER_HOST=$(bash scripts/container-engine.sh))
#
# Per scenario: wall time, cases/s, the ratio to xargs, and the CPU time (user + system) of
# casebatch's own runner process (worker in-process) and of the embedded Temporal server.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-601}
C=${C:-64}
BIG=${BIG:-10000}
RUNS=${RUNS:-3}
# The release binary, built as the README's demo command builds it (the tests use the `testing`
# profile: casebatch's crates less optimized); or CASEBATCH_BIN, to measure another build (an
# earlier commit's, back to back with this one's).
if [ -n "${CASEBATCH_BIN:-}" ]; then
  BIN=$CASEBATCH_BIN
else
  cargo build --release -q -p casebatch-cli
  BIN=$PWD/target/release/casebatch
fi
# BENCH_DIR: where bundles are written (default /tmp); its filesystem shows in the figures.
WORK=$(mktemp -d "${BENCH_DIR:-/tmp}/casebatch-bench.XXXXXX")
trap 'mountpoint -q "$WORK/fresh" && umount "$WORK/fresh"; rm -rf "$WORK"' EXIT
TICK=$(getconf CLK_TCK)

manifest() { # name runtime harness count concurrency
  local f="$WORK/$1.yaml"
  {
    echo "batch_id: $1"
    if [ -n "${SLURM_PARTITION:-}" ]; then
      echo "runtimes: {hpc: {kind: slurm, partition: $SLURM_PARTITION}}"
    elif [ -n "${AGENT2_ADDR:-}" ]; then
      echo "runtimes: {bench-agent: {kind: agent, endpoint: 'http://$AGENT_ADDR'}, bench-agent-2: {kind: agent, endpoint: 'http://$AGENT2_ADDR'}}"
    elif [ -n "${AGENT_ADDR:-}" ]; then
      echo "runtimes: {bench-agent: {kind: agent, endpoint: 'http://$AGENT_ADDR'}}"
    fi
    echo "defaults:"
    echo "  concurrency: $5"
    echo "  runtime: $2"
    [ -n "$3" ] && echo "  harness: '$3'"
    [ -n "${EXTRA:-}" ] && echo "  $EXTRA"
    [ -n "${SANDBOX_IMAGE:-}" ] && echo "  sandbox: {provider: container, template: '$SANDBOX_IMAGE'}"
    echo "tasks:"
    for i in $(seq 1 "$4"); do echo "  - task_id: case-$i"; done
  } > "$f"
  echo "$f"
}

now() { date +%s.%N; }
calc() { awk "BEGIN { print $1 }"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# CPU seconds (user + system) a live process has used itself, children excluded.
cpu_of() { awk -v t="$TICK" '{ print ($14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || true; }

# The file-system state a round of the local rows runs on (FS_STATE), made before the round:
#   aged:  a synthetic earlier bundle (AGE_INODES files, default 6,000: about what a 601-case
#          batch leaves) is made and deleted in the bench directory just before. ext4 without a
#          journal scans past every inode deleted in the last 5 to 300 s on each allocation, so
#          this is the state a batch meets after its predecessor's bundle was removed.
#   fresh: a newly made ext4 (journal as the bench directory's), mounted for the round, holding
#          the bundle, the engine's files and the scratch space. Needs root and a loop device.
#   journaled: a newly made ext4 with a journal (mkfs.ext4's default), mounted like `fresh` and
#          aged like `aged`. Without a journal, ext4 checks each free inode it passes over when
#          allocating for a recent deletion; with one it does not (fs/ext4/ialloc.c,
#          `recently_deleted`). This state shows what aging costs on such a file system.
# Other rounds run as they find the file system.
round_fs() { # out-dir-variable-name
  case "${FS_STATE:-}" in
    aged)
      age_in "$WORK"
      ;;
    fresh | journaled)
      local img="$WORK/fresh.img" mnt="$WORK/fresh" features=""
      mountpoint -q "$mnt" && umount "$mnt"
      rm -f "$img"; mkdir -p "$mnt"
      [ "$FS_STATE" = fresh ] && ! tune2fs -l "$(findmnt -no SOURCE -T "$WORK")" 2>/dev/null \
        | grep -q has_journal && features="-O ^has_journal"
      truncate -s 4G "$img"
      # shellcheck disable=SC2086 # features is one flag and its value, or nothing
      mkfs.ext4 -q -F $features "$img" >&2 && mount -o loop "$img" "$mnt" >&2
      [ "$FS_STATE" = journaled ] && age_in "$mnt"
      printf -v "$1" "%s" "$mnt/out"
      export CASEBATCH_SCRATCH_DIR="$mnt/s"
      ;;
  esac
}

# Makes and deletes AGE_INODES files (default 6,000: about what a 601-case batch leaves) in `dir`.
age_in() { # dir
  local age="$1/age-$RANDOM"
  mkdir "$age" && (cd "$age" && seq 1 "${AGE_INODES:-6000}" | xargs touch) && rm -rf "$age"
}

# Undoes what `round_fs` set up for a round.
round_fs_done() {
  if [ "${FS_STATE:-}" = fresh ] || [ "${FS_STATE:-}" = journaled ]; then
    unset CASEBATCH_SCRATCH_DIR
    umount "$WORK/fresh" && rm -f "$WORK/fresh.img"
  fi
}

# Whether a fresh file system can be made here (root, mkfs.ext4, a loop device).
can_make_fresh_fs() {
  [ "$(id -u)" = 0 ] && command -v mkfs.ext4 > /dev/null && command -v tune2fs > /dev/null \
    && losetup -f > /dev/null 2>&1
}

# Runs a batch on a fresh output dir (its own embedded engine). Prints
# "wall runner_cpu engine_cpu peak_rss_kb"; CPU figures are the last samples before exit.
# KEEP_OUT=DIR runs in DIR and keeps it (batches that learn from earlier ones); RUN_ARGS adds
# flags to `batch run`.
run_batch() {
  local name=$1 file=$2 out="${KEEP_OUT:-$WORK/out-$1-$RANDOM}" t0 t1 pid peak=0 rss cpu=0 ecpu=0 epid="" c
  round_fs out
  # A batch id of its own per round: an agent's job table (kept across rounds) refuses an
  # attempt key that another bundle already used.
  sed "s/^batch_id: .*/batch_id: $name-$RANDOM/" "$file" > "$out.yaml"
  t0=$(now)
  # shellcheck disable=SC2086 # RUN_ARGS is a list of flags
  "$BIN" batch run --manifest "$out.yaml" --output-dir "$out" ${RUN_ARGS:-} > "$WORK/$name.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    [ -n "$rss" ] && [ "$rss" -gt "$peak" ] && peak=$rss
    c=$(cpu_of "$pid"); [ -n "$c" ] && cpu=$c
    [ -z "$epid" ] && epid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' \
      "$out/.casebatch-engine/engine.json" 2>/dev/null || true)
    if [ -n "$epid" ]; then c=$(cpu_of "$epid"); [ -n "$c" ] && ecpu=$c; fi
    sleep 0.2
  done
  wait "$pid" || { echo "batch $name failed:"; cat "$WORK/$name.log"; exit 1; }
  t1=$(now)
  local cost
  cost=$(bundle_cost "$(ls -d "$out"/*/ | head -1)")
  [ -n "${KEEP_OUT:-}" ] || rm -rf "$out"
  round_fs_done
  echo "$(calc "$t1 - $t0") $cpu $ecpu $peak $cost"
}

# "actions-per-case inodes-per-attempt" of a finished bundle: the Temporal actions its
# workflow counted, and the files and directories its attempts made.
bundle_cost() {
  python3 - "$1" <<'PY'
import json, os, sys
root = sys.argv[1]
s = json.load(open(os.path.join(root, "batch_summary.json")))
actions = sum((s.get("temporal_actions") or {}).values())
inodes = 0
cases = os.path.join(root, "cases")
for case in os.listdir(cases):
    attempts = os.path.join(cases, case, "attempts")
    for _, dirs, files in os.walk(attempts):
        inodes += len(dirs) + len(files)
print(f"{actions / max(s['total'], 1):.2f} {inodes / max(s['attempts_total'], 1):.1f}")
PY
}

xargs_run() { # count concurrency command
  local t0 t1
  t0=$(now)
  seq 1 "$1" | xargs -P "$2" -I{} sh -c "$3"
  t1=$(now)
  calc "$t1 - $t0"
}

# scenario label runtime harness count [baseline command]: RUNS rounds, medians printed;
# the median cases/s is left in $RATE for comparisons.
scenario() {
  local label=$1 runtime=$2 harness=$3 count=$4 base_cmd=${5:-} f r walls="" ratios="" cpus="" ecpus="" peaks="" acts="" inodes=""
  f=$(manifest "b$RANDOM" "$runtime" "$harness" "$count" "$C")
  for _ in $(seq 1 "$RUNS"); do
    r=$(run_batch "$(basename "$f" .yaml)" "$f")
    set -- $r
    walls+="$1"$'\n'; cpus+="$2"$'\n'; ecpus+="$3"$'\n'; peaks+="$4"$'\n'
    acts+="$5"$'\n'; inodes+="$6"$'\n'
    if [ -n "$base_cmd" ]; then
      ratios+="$(calc "$1 / $(xargs_run "$count" "$C" "$base_cmd")")"$'\n'
    fi
  done
  local wall cpu ecpu peak
  wall=$(printf "%s" "$walls" | median); cpu=$(printf "%s" "$cpus" | median)
  ecpu=$(printf "%s" "$ecpus" | median); peak=$(printf "%s" "$peaks" | median)
  RATE=$(calc "$count / $wall")
  printf "%-40s %6d cases %7.2fs %7.1f cases/s" "$label" "$count" "$wall" "$RATE"
  [ -n "$ratios" ] && printf " · %.2fx xargs -P %s" "$(printf "%s" "$ratios" | median)" "$C"
  printf " · CPU runner %.1fs (%.1f ms/case), server %.1fs (%.1f ms/case) · peak %d MB" \
    "$cpu" "$(calc "1000 * $cpu / $count")" "$ecpu" "$(calc "1000 * $ecpu / $count")" \
    "$(calc "int($peak / 1024)")"
  printf " · %.2f actions/case · %.1f inodes/attempt\n" \
    "$(printf "%s" "$acts" | median)" "$(printf "%s" "$inodes" | median)"
}

# Starts `casebatch agent` NAME on a free loopback port; prints "pid address". A restart on
# the same data directory keeps its job table.
start_agent() {
  local dir="$WORK/agent-$1" pid
  mkdir -p "$dir"
  rm -f "$dir/agent.addr"
  "$BIN" agent --listen 127.0.0.1:0 --data-dir "$dir" --max-concurrent 256 > "$WORK/agent-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do [ -s "$dir/agent.addr" ] && break; sleep 0.1; done
  [ -s "$dir/agent.addr" ] || { echo "the agent did not start:" >&2; cat "$WORK/agent-$1.log" >&2; exit 1; }
  echo "$pid $(cat "$dir/agent.addr")"
}

# The same `true` batch through one `casebatch agent` on loopback, against local-process
# measured just before: throughput ratio, and the agent's own CPU and resident memory. Then
# the batch dealt over two agents (`runtime: [a, b]`), against one agent: what routing over
# a list costs (each dispatch consults the runtime's circuit breaker).
agent_vs_local() {
  scenario "local-process, trivial command (true)" local-process 'true' "$N" 'true'
  local local_rate=$RATE one_rate apid apid2 started
  started=$(start_agent a); apid=${started% *}; AGENT_ADDR=${started#* }
  scenario "agent on loopback, trivial command (true)" bench-agent 'true' "$N" 'true'
  one_rate=$RATE
  printf "  agent/local-process throughput %.2fx · agent CPU %.1fs (%.1f ms/case over %d runs) · agent peak %d MB\n" \
    "$(calc "$RATE / $local_rate")" "$(cpu_of "$apid")" "$(calc "1000 * $(cpu_of "$apid") / ($N * $RUNS)")" "$RUNS" \
    "$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$apid/status")"
  started=$(start_agent b); apid2=${started% *}; AGENT2_ADDR=${started#* }
  scenario "two agents, runtime: [a, b] (true)" "[bench-agent, bench-agent-2]" 'true' "$N" 'true'
  printf "  two agents by list / one agent throughput %.2fx\n" "$(calc "$RATE / $one_rate")"
  kill "$apid" "$apid2"; wait "$apid" "$apid2" 2>/dev/null || true
  unset AGENT_ADDR AGENT2_ADDR
}

# Two agents on loopback, one 3x slower (its harness sleeps 3 s where the other's sleeps 1 s),
# each taking 4 cases at once (max_concurrent), 40 cases dealt from [slow, fast]. Per round, in
# one fresh output dir: the even split without speculation (no run history yet), then the same
# batch again, dealt by the weights the first run left in the run history, speculation on.
tail_vs_uniform() {
  local started spid fpid r u w walls_u="" walls_w="" ratios="" cpus_u="" cpus_w="" split=""
  started=$(BENCH_AGENT=slow start_agent slow); spid=${started% *}; local slow_addr=${started#* }
  started=$(BENCH_AGENT=fast start_agent fast); fpid=${started% *}; local fast_addr=${started#* }
  local f="$WORK/tail.yaml"
  {
    echo "batch_id: tail"
    echo "runtimes:"
    echo "  slow: {kind: agent, endpoint: 'http://$slow_addr', max_concurrent: 4}"
    echo "  fast: {kind: agent, endpoint: 'http://$fast_addr', max_concurrent: 4}"
    echo "defaults:"
    echo "  concurrency: 8"
    echo "  runtime: [slow, fast]"
    echo "  pass_env: [BENCH_AGENT]"
    echo "  harness: 'if [ \"\$BENCH_AGENT\" = slow ]; then sleep 3; else sleep 1; fi'"
    echo "tasks:"
    for i in $(seq 1 40); do echo "  - task_id: t$i"; done
  } > "$f"
  for r in $(seq 1 "$RUNS"); do
    mkdir -p "$WORK/tail-$r"
    u=$(KEEP_OUT="$WORK/tail-$r" RUN_ARGS=--no-speculation run_batch uniform "$f")
    w=$(KEEP_OUT="$WORK/tail-$r" run_batch weighted "$f")
    walls_u+="${u%% *}"$'\n'; walls_w+="${w%% *}"$'\n'
    cpus_u+="$(echo "$u" | cut -d' ' -f2)"$'\n'; cpus_w+="$(echo "$w" | cut -d' ' -f2)"$'\n'
    ratios+="$(calc "${w%% *} / ${u%% *}")"$'\n'
    split=$(grep -o 'dealt by weight: .*' "$WORK/weighted.log" || true)
  done
  kill "$spid" "$fpid"; wait "$spid" "$fpid" 2>/dev/null || true
  printf "%-40s %6d cases %7.2fs · CPU runner %.1fs\n" "even split, no speculation" 40 \
    "$(printf "%s" "$walls_u" | median)" "$(printf "%s" "$cpus_u" | median)"
  printf "%-40s %6d cases %7.2fs · CPU runner %.1fs\n" "weighted by history, speculation on" 40 \
    "$(printf "%s" "$walls_w" | median)" "$(printf "%s" "$cpus_w" | median)"
  printf "  weighted/even wall time %.2fx (median of %d paired rounds) · %s\n" \
    "$(printf "%s" "$ratios" | median)" "$RUNS" "$split"
}

# The local runtime's cost per case: N x `sleep 1` and N x `true` at C in flight against
# `xargs -P C`, then 1,024 x `sleep 1` at 256 in flight (the runner's CPU per case should not
# grow with the width). WIDE=1 adds 2,048 x `sleep 10` at 512 in flight (the seeds' widest
# batches; about four minutes a round).
local_cost() {
  local states=${FS:-aged fresh} state
  if [[ $states == *fresh* || $states == *journaled* ]] && ! can_make_fresh_fs; then
    echo "fresh and journaled file systems: skipped (need root, mkfs.ext4 and a free loop device)"
    states=${states/fresh/}
    states=${states/journaled/}
  fi
  for state in $states; do
    echo "-- file system: $state"
    FS_STATE=$state local_rows
  done
  if [ -n "${WIDE:-}" ]; then wide_cost; fi
}

local_rows() {
  scenario "local-process, sleep 1" local-process 'sleep 1' "$N" 'sleep 1'
  scenario "local-process, trivial command (true)" local-process 'true' "$N" 'true'
  C=256 scenario "local-process, sleep 1, 256 in flight" local-process 'sleep 1' 1024 'sleep 1'
}

wide_cost() {
  C=512 scenario "local-process, sleep 10, 512 in flight" local-process 'sleep 10' 2048 'sleep 10'
}

# An agent that has run for months keeps every ended job's row: the same `true` batch through
# an agent whose table holds AGED (default 300,000) ended rows, against a fresh agent measured
# just before. The rows are written into the agent's own table while it is stopped, as
# having ended just now (a busy agent's week under the default --keep-ended 7d, or months
# under forever).
aged_vs_fresh() {
  local started apid fresh_rate dir="$WORK/agent-aged"
  started=$(start_agent fresh); apid=${started% *}; AGENT_ADDR=${started#* }
  scenario "agent, fresh job table (true)" bench-agent 'true' "$N"
  fresh_rate=$RATE
  printf "  fresh agent CPU %.1fs (%.1f ms/case over %d runs)\n" \
    "$(cpu_of "$apid")" "$(calc "1000 * $(cpu_of "$apid") / ($N * $RUNS)")" "$RUNS"
  kill "$apid"; wait "$apid" 2>/dev/null || true
  started=$(start_agent aged); apid=${started% *}
  kill "$apid"; wait "$apid" 2>/dev/null || true
  python3 - "$dir/jobs.sqlite" "${AGED:-300000}" <<'PY'
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1])
cols = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
# Ended just now: inside any --keep-ended, so the agent's retention leaves them be.
now = int(time.time() * 1000)
old = {"state": "ended", "report": '{"exit_code": 0}', "cleanup_receipt": '{"cleanup_confirmed": true}',
       "planned_case_json": '{"case_id": "old"}', "ended_at_ms": now, "cleaned_at_ms": now, "submitted_at_ms": now}
def row(i):
    return [f"old-{i}" if c == "job_key" else old.get(c, f"old-{i // 643}" if c == "batch_id" else 0)
            for c in cols]
db.executemany(f"INSERT INTO jobs VALUES ({','.join('?' * len(cols))})", (row(i) for i in range(int(sys.argv[2]))))
db.commit()
PY
  started=$(start_agent aged); apid=${started% *}; AGENT_ADDR=${started#* }
  scenario "agent, ${AGED:-300000} ended jobs in its table (true)" bench-agent 'true' "$N"
  printf "  aged/fresh throughput %.2fx · aged agent CPU %.1fs (%.1f ms/case over %d runs)\n" \
    "$(calc "$RATE / $fresh_rate")" "$(cpu_of "$apid")" "$(calc "1000 * $(cpu_of "$apid") / ($N * $RUNS)")" "$RUNS"
  kill "$apid"; wait "$apid" 2>/dev/null || true
  unset AGENT_ADDR
}

# Slow sandboxes, SIMULATED (the fake runtime: 1 s to provision, 1 s to run), 40 cases at 4
# in flight: provisioned at dispatch (`prepare_ahead: 0`) against 4 provisioned ahead, paired
# per round.
prepare_vs_dispatch() {
  local f0="$WORK/ahead-0.yaml" f4="$WORK/ahead-4.yaml" r a b walls_0="" walls_4="" ratios="" cpus_0="" cpus_4=""
  for ahead in 0 4; do
    {
      echo "batch_id: ahead-$ahead"
      echo "defaults:"
      echo "  concurrency: 4"
      echo "  prepare_ahead: $ahead"
      echo "  runtime: fake"
      echo "  fake: {duration_ms: 1000, provision_ms: 1000}"
      echo "tasks:"
      for i in $(seq 1 40); do echo "  - task_id: t$i"; done
    } > "$WORK/ahead-$ahead.yaml"
  done
  for r in $(seq 1 "$RUNS"); do
    a=$(run_batch at-dispatch "$f0")
    b=$(run_batch ahead "$f4")
    walls_0+="${a%% *}"$'\n'; walls_4+="${b%% *}"$'\n'
    cpus_0+="$(echo "$a" | cut -d' ' -f2)"$'\n'; cpus_4+="$(echo "$b" | cut -d' ' -f2)"$'\n'
    ratios+="$(calc "${b%% *} / ${a%% *}")"$'\n'
  done
  printf "%-40s %6d cases %7.2fs · CPU runner %.1fs\n" "simulated sandboxes, provisioned at dispatch" 40 \
    "$(printf "%s" "$walls_0" | median)" "$(printf "%s" "$cpus_0" | median)"
  printf "%-40s %6d cases %7.2fs · CPU runner %.1fs\n" "simulated sandboxes, 4 provisioned ahead" 40 \
    "$(printf "%s" "$walls_4" | median)" "$(printf "%s" "$cpus_4" | median)"
  printf "  ahead/at-dispatch wall time %.2fx (median of %d paired rounds)\n" \
    "$(printf "%s" "$ratios" | median)" "$RUNS"
}

# What the budget and pace policies cost: N x `sleep 1` at C whose harness reports usage,
# without either, with a budget it never reaches (every admission asks it), and with that
# budget and a pace it never reaches (every start is booked), in rounds of the three.
policies_cost() {
  local h='sleep 1; echo "{\"usage\": {\"cost_usd\": 0.01, \"input_tokens\": 100}}" > "$CASEBATCH_RESULT"'
  local labels=("sleep 1 reporting usage, no policy" "sleep 1 reporting usage, a budget"
    "sleep 1 reporting usage, budget + pace")
  local files=() walls=("" "" "") cpus=("" "" "") ratios=("" "" "") r k
  files[0]=$(manifest unbudgeted local-process "$h" "$N" "$C")
  files[1]=$(EXTRA="budget: {cost_usd: 1000000}" manifest budgeted local-process "$h" "$N" "$C")
  files[2]=$(EXTRA="budget: {cost_usd: 1000000}"$'\n'"  rate: {starts_per_minute: 60000}" \
    manifest paced local-process "$h" "$N" "$C")
  local ids=(unbudgeted budgeted paced)
  for _ in $(seq 1 "$RUNS"); do
    local base=""
    for k in 0 1 2; do
      r=$(run_batch "${ids[$k]}" "${files[$k]}")
      walls[$k]+="${r%% *}"$'\n'
      cpus[$k]+="$(echo "$r" | cut -d' ' -f2)"$'\n'
      if [ $k = 0 ]; then base=${r%% *}; else ratios[$k]+="$(calc "${r%% *} / $base")"$'\n'; fi
    done
  done
  local cpu
  for k in 0 1 2; do
    cpu=$(printf "%s" "${cpus[$k]}" | median)
    printf "%-40s %6d cases %7.2fs · CPU runner %.1fs (%.1f ms/case)\n" "${labels[$k]}" "$N" \
      "$(printf "%s" "${walls[$k]}" | median)" "$cpu" "$(calc "1000 * $cpu / $N")"
  done
  printf "  budget/none wall time %.3fx, budget + pace/none %.3fx (medians of %d rounds)\n" \
    "$(printf "%s" "${ratios[1]}" | median)" "$(printf "%s" "${ratios[2]}" | median)" "$RUNS"
}

echo "casebatch benchmark: N=$N, concurrency $C, $(nproc) cores, embedded dev server, median of $RUNS"
# 200 x `true`, each in a fresh container, 16 in flight, against `xargs -P 16` running `podman
# run --rm IMAGE true` through the same engine: what casebatch's durability (records, labels,
# log harvest, evaluator check, confirmed removal) costs on top of the engine's own create,
# start, wait and remove. The engine's CPU is podman's, not casebatch's, and is not counted.
# One batch far past what a workflow payload holds as plain JSON (the carried state of
# 100,000 cases was 2.1 MB and wedged the batch): it must complete; while it runs, `batch
# status` is asked every 10 s and its slowest answer reported, with the runner's peak RSS.
huge_batch() {
  local count=${HUGE:-100000} f out="$WORK/huge" pid t0 t1 ts took peak
  f="$WORK/huge.yaml"
  { echo "batch_id: huge"; echo "defaults: {concurrency: $C, runtime: fake}"; echo "tasks:"
    seq 1 "$count" | sed 's/^/  - task_id: case-/'; } > "$f"
  t0=$(now)
  # The runner's peak resident memory, from the kernel when it exits: sampling misses the
  # short peaks (the batch files are written in the last seconds).
  /usr/bin/time -f %M -o "$WORK/huge.rss" \
    "$BIN" batch run --manifest "$f" --output-dir "$out" > "$WORK/huge.log" 2>&1 &
  pid=$!
  : > "$WORK/huge.status"
  while kill -0 "$pid" 2>/dev/null; do
    ts=$(now)
    if "$BIN" batch status --batch-id huge --output-dir "$out" > /dev/null 2>&1; then
      took=$(calc "$(now) - $ts")
      echo "$took" >> "$WORK/huge.status"
    fi
    sleep 5
  done
  wait "$pid" || { echo "huge batch failed:"; tail -20 "$WORK/huge.log"; exit 1; }
  t1=$(now)
  peak=$(tail -1 "$WORK/huge.rss")
  printf "%-48s %8.1fs %7.1f cases/s  runner peak RSS %d MB, status median %.2fs, slowest %.2fs (%d asked)\n" \
    "fake runtime (simulation), $count cases" "$(calc "$t1 - $t0")" \
    "$(calc "$count / ($t1 - $t0)")" "$((peak / 1024))" "$(median < "$WORK/huge.status")" \
    "$(sort -g "$WORK/huge.status" | tail -1)" "$(wc -l < "$WORK/huge.status")"
}

containers_vs_podman_run() {
  : "${DOCKER_HOST:?export DOCKER_HOST=\$(bash scripts/container-engine.sh)}"
  local image=localhost/casebatch-test-busybox:1
  # The same limits casebatch gives its containers (the engine process's own): these
  # machines refuse podman's defaults.
  local service limits
  service=$(pgrep -f "podman system service" | head -1)
  limits=$(awk '/^Max open files/ {printf "--ulimit nofile=%s:%s ", $4, $5}
                /^Max processes/ {printf "--ulimit nproc=%s:%s ", $3, $4}' "/proc/$service/limits")
  SANDBOX_IMAGE=$image C=16 scenario "container sandbox, trivial command (true)" local-process \
    'true' "${N_CONTAINERS:-200}" "podman --url $DOCKER_HOST run --rm $limits $image true"
}

# 300 x `sleep 1` at 32 in flight through `kind: slurm`, against `xargs -P 32` of `sbatch
# --wait --wrap 'sleep 1'` on the same cluster, in the same run. Every call casebatch makes to
# Slurm goes through a shim on PATH that counts it.
slurm_vs_sbatch_wait() {
  local count=${N_SLURM:-300} real
  # munged wants every directory above its socket open to all.
  chmod 755 "$WORK"
  export CASEBATCH_SLURM_DIR="$WORK/slurm"
  SLURM_CONF=$(bash scripts/slurm-cluster.sh)
  export SLURM_CONF
  trap 'bash scripts/slurm-cluster.sh stop; mountpoint -q "$WORK/fresh" && umount "$WORK/fresh"; rm -rf "$WORK"' EXIT
  mkdir -p "$WORK/shims"
  for tool in sbatch squeue scancel; do
    real=$(command -v "$tool")
    printf '#!/bin/sh
echo %s >> "%s/calls"
exec %s "$@"
' "$tool" "$WORK" "$real" > "$WORK/shims/$tool"
    chmod +x "$WORK/shims/$tool"
  done
  : > "$WORK/calls"
  PATH="$WORK/shims:$PATH" SLURM_PARTITION=debug C=32 scenario "slurm, sleep 1" hpc 'sleep 1' \
    "$count" "$(command -v sbatch) --wait --quiet --output=/dev/null --wrap 'sleep 1'"
  awk -v n="$count" -v runs="$RUNS" '{ c[$1]++ } END {
    printf "slurm calls per case (casebatch): %.2f sbatch, %.2f squeue, %.2f scancel\n",
      c["sbatch"] / (n * runs), c["squeue"] / (n * runs), c["scancel"] / (n * runs) }' "$WORK/calls"
}

# One agent of 8 slots shared by two users (docs/sharing.md). Each round: 200 x `sleep 2` at
# 64 from ann alone; then the same with 16 x `sleep 2` at 8 from bob started once ann's batch
# fills the agent. Every job records its start and end on the boot clock; from those: the
# agent's utilization (busy slot-seconds / (8 x the span)), bob's share while both run and
# bob's span (fair-share time: 16 jobs x 2 s / 4 slots = 8 s), and the runners' CPU.
shared_agent() {
  local dir="$WORK/agent-shared" apid addr round
  mkdir -p "$dir"; rm -f "$dir/agent.addr"
  # Jobs read BENCH_JOBS on the agent's host (`pass_env`): where they record themselves.
  BENCH_JOBS="$WORK/jobs" "$BIN" agent --listen 127.0.0.1:0 --data-dir "$dir" --max-concurrent 8 \
    > "$WORK/agent-shared.log" 2>&1 &
  apid=$!
  for _ in $(seq 1 300); do [ -s "$dir/agent.addr" ] && break; sleep 0.1; done
  addr=$(cat "$dir/agent.addr")
  shared_manifest() { # batch-id cases width
    printf "batch_id: %s\nruntimes: {box: {kind: agent, endpoint: 'http://%s'}}\n" "$1" "$addr"
    printf "defaults:\n  runtime: box\n  concurrency: %s\n  pass_env: [BENCH_JOBS]\n" "$3"
    # shellcheck disable=SC2016 # expanded by the harness's shell
    printf '  harness: '"'"'read up _ < /proc/uptime; echo "$CASEBATCH_BATCH_ID s $up" >> "$BENCH_JOBS"; sleep 2; read up _ < /proc/uptime; echo "$CASEBATCH_BATCH_ID e $up" >> "$BENCH_JOBS"; echo {} > "$CASEBATCH_RESULT"'"'"'\n'
    echo "tasks:"
    for i in $(seq 1 "$2"); do echo "  - {task_id: c$i}"; done
  }
  for round in $(seq 1 "$RUNS"); do
    for mode in alone shared; do
      local out="$WORK/shared-$round-$mode" jobs="$WORK/jobs" wide narrow wpid npid wcpu=0 ncpu=0 c
      mkdir -p "$out"; : > "$jobs"
      wide="wide-$round-$mode"; narrow="narrow-$round-$mode"
      shared_manifest "$wide" 200 64 > "$out/$wide.yaml"
      shared_manifest "$narrow" 16 8 > "$out/$narrow.yaml"
      USER=ann "$BIN" batch run --manifest "$out/$wide.yaml" --output-dir "$out" > "$WORK/$wide.log" 2>&1 &
      wpid=$!; npid=""
      while kill -0 "$wpid" 2>/dev/null; do
        c=$(cpu_of "$wpid"); [ -n "$c" ] && wcpu=$c
        if [ -n "$npid" ]; then c=$(cpu_of "$npid"); [ -n "$c" ] && ncpu=$c; fi
        if [ "$mode" = shared ] && [ -z "$npid" ] && [ "$(grep -c "^$wide s" "$jobs")" -ge 24 ]; then
          USER=bob "$BIN" batch run --manifest "$out/$narrow.yaml" --output-dir "$out" > "$WORK/$narrow.log" 2>&1 &
          npid=$!
        fi
        sleep 0.2
      done
      wait "$wpid" || { echo "shared bench: $wide failed"; cat "$WORK/$wide.log"; exit 1; }
      [ -z "$npid" ] || wait "$npid" || { echo "shared bench: $narrow failed"; cat "$WORK/$narrow.log"; exit 1; }
      python3 - "$jobs" "$wide" "$narrow" "$mode" "$wcpu" "$ncpu" >> "$WORK/shared.rows" <<'PY'
import sys
path, wide, narrow, mode, wcpu, ncpu = sys.argv[1:]
open_, jobs = {}, []
for line in open(path):
    b, edge, t = line.split()
    if edge == "s":
        open_.setdefault(b, []).append(float(t))
    else:
        jobs.append((b, open_[b].pop(0), float(t)))
def busy(frm, to, batch=None):
    return sum(max(0.0, min(e, to) - max(s, frm)) for b, s, e in jobs if batch in (None, b))
first = min(s for _, s, _ in jobs)
last_start = max(s for b, s, _ in jobs if b == wide)
# Alone: from the first start to the wide batch's last start (its tail drains, unrefilled).
util_alone = busy(first, last_start) / (8 * (last_start - first))
if mode == "alone":
    print(f"alone {util_alone:.4f} - - - {float(wcpu) * 1000 / 200:.2f}")
else:
    n = [(s, e) for b, s, e in jobs if b == narrow]
    frm, to = min(s for s, _ in n), max(e for _, e in n)
    share = busy(frm, to, narrow) / busy(frm, to)
    util_shared = busy(frm, to) / (8 * (to - frm))
    cpu = (float(wcpu) + float(ncpu)) * 1000 / 216
    print(f"shared {util_alone:.4f} {util_shared:.4f} {share:.4f} {to - frm:.2f} {cpu:.2f}")
PY
      rm -rf "$out"
    done
  done
  kill "$apid" 2>/dev/null || true
  awk '{ print }' "$WORK/shared.rows" >&2
  python3 - "$WORK/shared.rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs)
alone = [float(r[1]) for r in rows if r[0] == "alone"]
sh = [r for r in rows if r[0] == "shared"]
print(f"agent of 8 slots, one batch alone (200 x sleep 2 at 64): utilization {100 * med(alone):.1f}% "
      f"({' / '.join(f'{100 * x:.1f}' for x in alone)}) · runner CPU "
      f"{med([float(r[5]) for r in rows if r[0] == 'alone']):.1f} ms/case")
print(f"two users sharing it (+16 x sleep 2 at 8): small batch's share {100 * med([float(r[3]) for r in sh]):.1f}% "
      f"({' / '.join(f'{100 * float(r[3]):.1f}' for r in sh)}), its span {med([float(r[4]) for r in sh]):.1f}s "
      f"(fair-share time 8 s; {' / '.join(r[4] for r in sh)}), utilization while both ran "
      f"{100 * med([float(r[2]) for r in sh]):.1f}% ({' / '.join(f'{100 * float(r[2]):.1f}' for r in sh)}) · "
      f"runners' CPU {med([float(r[5]) for r in sh]):.1f} ms/case")
PY
}

if [ "${ONLY:-}" = shared ]; then shared_agent; exit 0; fi
if [ "${ONLY:-}" = slurm ]; then slurm_vs_sbatch_wait; exit 0; fi
if [ "${ONLY:-}" = huge ]; then huge_batch; exit 0; fi
if [ "${ONLY:-}" = containers ]; then containers_vs_podman_run; exit 0; fi
if [ "${ONLY:-}" = agent ]; then agent_vs_local; exit 0; fi
if [ "${ONLY:-}" = tail ]; then tail_vs_uniform; exit 0; fi
if [ "${ONLY:-}" = local ]; then local_cost; exit 0; fi
if [ "${ONLY:-}" = wide ]; then wide_cost; exit 0; fi
if [ "${ONLY:-}" = prepare ]; then prepare_vs_dispatch; exit 0; fi
if [ "${ONLY:-}" = policies ]; then policies_cost; exit 0; fi
if [ "${ONLY:-}" = aged ]; then aged_vs_fresh; exit 0; fi
local_cost
scenario "fake runtime (simulation), no-op" fake '' "$N"
agent_vs_local
tail_vs_uniform
aged_vs_fresh
prepare_vs_dispatch
policies_cost
if [ -z "${SKIP_10K:-}" ]; then
  RUNS=1 scenario "fake runtime (simulation), $BIG cases" fake '' "$BIG"
fi
