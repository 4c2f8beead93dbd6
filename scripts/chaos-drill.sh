#!/usr/bin/env bash
# Chaos drill: the recovery invariants as one repeatable script, run by the integration
# tests too (tests/integration/recovery.rs). Every real execution of a case appends a line,
# so "nothing ran twice" is counted, not assumed. Exits 1 if an invariant breaks.
#
#   1. SIGKILL the runner (which hosts the worker) mid-batch, then resume: finished cases are
#      kept, in-flight cases are adopted, the batch completes.
#   2. SIGKILL a single-case run (`casebatch run`), then run it again: it adopts, no re-run.
#   3. SIGKILL the embedded Temporal dev server mid-batch: the runner brings it back on the
#      same database and the batch completes.
#   4. SIGKILL one of two runtime agents of a `runtime: [a, b]` batch mid-batch and leave it
#      down: its cases spill to the other, its circuit opens after 3 failed dispatches (later
#      cases skip it without failing), the width halves, and every case completes.
#   5. The seeds' drill: a runtime dead before the batch and left down, a healthy one beside
#      it, 8 cases (max_retries 2, 4 wide, default breaker): 8/8 pass, no retry is spent on
#      the dead runtime, and the batch takes less than 3x the same batch with both up.
#
#   scripts/chaos-drill.sh                 # uses target/release/casebatch
#   CASEBATCH_BIN=... WORK=dir N=12 scripts/chaos-drill.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CASEBATCH_BIN:-$PWD/target/release/casebatch}
WORK=${WORK:-$(mktemp -d /tmp/casebatch-chaos.XXXXXX)}
N=${N:-12}
SECS=${SECS:-3}
mkdir -p "$WORK/side"
# The killed runner leaves its dev server behind (resume reuses it): stop it at the end.
cleanup() {
  for e in "$WORK"/out/.casebatch-engine/engine.json "$WORK"/engine-out/.casebatch-engine/engine.json; do
    [ -f "$e" ] && kill "$(python3 -c "import json; print(json.load(open('$e'))['pid'])")" 2>/dev/null || true
  done
}
trap cleanup EXIT
fail() { echo "drill FAILED: $*" >&2; exit 1; }
now() { date +%s.%N; }
lines() { { cat "$@" 2>/dev/null || true; } | wc -l; }

manifest() { # file batch-id count
  {
    echo "batch_id: $2"
    echo "defaults:"
    echo "  concurrency: 4"
    echo "  runtime: local-process"
    echo "  harness: 'echo x >> \"$WORK/side/\$CASEBATCH_BATCH_ID.\$CASEBATCH_CASE_ID.started\"; sleep $SECS; echo x >> \"$WORK/side/\$CASEBATCH_BATCH_ID.\$CASEBATCH_CASE_ID.done\"; echo {} > \"\$CASEBATCH_RESULT\"'"
    echo "tasks:"
    for i in $(seq 1 "$3"); do echo "  - task_id: c$i"; done
  } > "$1"
}

wait_for() { # seconds description command...
  local until=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@"; do [ "$(date +%s)" -lt "$until" ] || fail "timed out waiting for $what"; sleep 0.1; done
}
started_at_least() { [ "$(lines "$WORK"/side/"$1".*.started)" -ge "$2" ]; }

# --- 1. runner SIGKILL mid-batch, then resume ------------------------------------------
manifest "$WORK/kill.yaml" kill "$N"
"$BIN" batch run --manifest "$WORK/kill.yaml" --output-dir "$WORK/out" > "$WORK/kill-run.log" 2>&1 &
RUNNER=$!
done_at_least() { [ "$(lines "$WORK"/side/"$1".*.done)" -ge "$2" ]; }
wait_for 120 "the first wave to finish and the second to start" \
  sh -c "[ \$(cat $WORK/side/kill.*.done 2>/dev/null | wc -l) -ge 4 ] && [ \$(cat $WORK/side/kill.*.started | wc -l) -ge 8 ]"
kill -9 "$RUNNER"; wait "$RUNNER" 2>/dev/null || true
finished_before=$(lines "$WORK"/side/kill.*.done)
finished_cases=$(cd "$WORK/side" && ls kill.*.done | sed 's/\.done$//')
# One in-flight job goes down with its host: kill its whole process group, so nothing is
# left to adopt (no process, no exit status). It must be re-dispatched as a new attempt.
lost=""
for f in "$WORK"/side/kill.*.started; do
  case_id=$(basename "$f" .started); case_id=${case_id#kill.}
  job=$(python3 scripts/journal.py job "$WORK/out/kill/cases/$case_id/attempts/1")
  if [ ! -f "$WORK/side/kill.$case_id.done" ] && [ -n "$job" ]; then
    pid=$(echo "$job" | python3 -c "import json,sys; print(json.load(sys.stdin)['pid'])")
    kill -9 -- "-$pid" 2>/dev/null || true
    lost=$case_id
    break
  fi
done
[ -n "$lost" ] || fail "no in-flight job to purge"
t_restart=$(now)
"$BIN" batch resume --batch-id kill --output-dir "$WORK/out" > "$WORK/kill-resume.log" 2>&1 &
RESUMER=$!
first_progress() { [ "$(lines "$WORK"/side/kill.*.done)" -gt "$finished_before" ]; }
wait_for 120 "progress after the restart" first_progress
t_progress=$(now)
wait "$RESUMER" || fail "resume did not complete the batch (see $WORK/kill-resume.log)"
report=$("$BIN" batch report --batch-id kill --output-dir "$WORK/out" --json)
adopted=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"]["adopted_attempts"])')
redispatched=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["redispatched"])')
succeeded=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"]["counts"].get("succeeded", 0))')
reran=0
for c in $finished_cases; do [ "$(lines "$WORK/side/$c.started")" -gt 1 ] && reran=$((reran + 1)); done
twice=0
for f in "$WORK"/side/kill.*.started; do [ "$(lines "$f")" -gt 1 ] && twice=$((twice + 1)); done
[ "$succeeded" -eq "$N" ] || fail "worker kill: $succeeded of $N succeeded"
[ "$reran" -eq 0 ] || fail "worker kill: $reran finished case(s) ran again"
[ "$twice" -eq 1 ] || fail "worker kill: $twice case(s) started twice; only the purged one should"
[ "$(lines "$WORK/side/kill.$lost.started")" -eq 2 ] || fail "the purged case was not re-dispatched once"
[ "$adopted" -ge 1 ] || fail "worker kill: nothing was adopted"
[ "$redispatched" -ge 1 ] || fail "worker kill: the purged job was not re-dispatched"
first_progress_s=$(awk "BEGIN { printf \"%.2f\", $t_progress - $t_restart }")

# --- 2. SIGKILL during a single-case run --------------------------------------------------
manifest "$WORK/one.yaml" one 1
"$BIN" run --manifest "$WORK/one.yaml" --case c1 --output-dir "$WORK/out" > "$WORK/one-run.log" 2>&1 &
RUNNER=$!
wait_for 60 "the single case to start" started_at_least "one--c1" 1
kill -9 "$RUNNER"; wait "$RUNNER" 2>/dev/null || true
"$BIN" run --manifest "$WORK/one.yaml" --case c1 --output-dir "$WORK/out" > "$WORK/one-again.log" 2>&1 \
  || fail "single-case run did not succeed after the kill (see $WORK/one-again.log)"
single_runs=$(lines "$WORK"/side/one--c1.c1.started)
[ "$single_runs" -eq 1 ] || fail "single-case run: the case ran $single_runs times"
single_adopted=$(python3 -c "import json; print(json.load(open('$WORK/out/one--c1/cases/c1/result.json'))['adopted'])")

# --- 3. dev-server SIGKILL mid-batch --------------------------------------------------------
manifest "$WORK/engine.yaml" engine "$N"
"$BIN" batch run --manifest "$WORK/engine.yaml" --output-dir "$WORK/engine-out" > "$WORK/engine-run.log" 2>&1 &
RUNNER=$!
wait_for 60 "the first cases to start" started_at_least engine 4
server=$(python3 -c "import json; print(json.load(open('$WORK/engine-out/.casebatch-engine/engine.json'))['pid'])")
kill -9 "$server"
wait "$RUNNER" || fail "the batch did not complete after the dev server was killed (see $WORK/engine-run.log)"
engine_reran=0
for f in "$WORK"/side/engine.*.started; do [ "$(lines "$f")" -gt 1 ] && engine_reran=$((engine_reran + 1)); done
[ "$engine_reran" -eq 0 ] || fail "engine restart: $engine_reran case(s) ran twice"
[ "$(lines "$WORK"/side/engine.*.done)" -eq "$N" ] || fail "engine restart: not every case finished"

# --- 4. a runtime agent SIGKILLed mid-batch and left down --------------------------------------
# Enough cases that box-a's share outlasts the 3 failures that open its circuit.
FO_N=${FO_N:-24}
agent() { # name -> starts it, prints its address
  mkdir -p "$WORK/agent-$1"
  "$BIN" agent --listen 127.0.0.1:0 --data-dir "$WORK/agent-$1" > "$WORK/agent-$1.log" 2>&1 &
  echo $! > "$WORK/agent-$1.pid"
  wait_for 30 "agent $1 to listen" test -s "$WORK/agent-$1/agent.addr"
}
agent a; agent b
trap 'cleanup; kill "$(cat "$WORK/agent-a.pid")" "$(cat "$WORK/agent-b.pid")" 2>/dev/null || true' EXIT
pair_manifest() { # file batch-id cases [runtime settings]
  {
    echo "batch_id: $2"
    echo "runtimes:"
    for a in a b; do
      echo "  box-$a: {kind: agent, endpoint: 'http://$(cat "$WORK/agent-$a/agent.addr")'${4:-}}"
    done
    echo "defaults:"
    echo "  concurrency: 4"
    echo "  max_retries: 2"
    echo "  runtime: [box-a, box-b]"
    echo "  harness: 'echo x >> \"$WORK/side/\$CASEBATCH_BATCH_ID.\$CASEBATCH_CASE_ID.started\"; sleep 1; echo x >> \"$WORK/side/\$CASEBATCH_BATCH_ID.\$CASEBATCH_CASE_ID.done\"; echo {} > \"\$CASEBATCH_RESULT\"'"
    echo "tasks:"
    for i in $(seq 1 "$3"); do echo "  - task_id: c$i"; done
  } > "$1"
}
# The baseline of drill 5, while both agents are up.
pair_manifest "$WORK/pair.yaml" pair 8
t0=$(now)
"$BIN" batch run --manifest "$WORK/pair.yaml" --output-dir "$WORK/pair-out" > "$WORK/pair-run.log" 2>&1 \
  || fail "the batch on both agents failed (see $WORK/pair-run.log)"
both_up_s=$(awk "BEGIN { printf \"%.1f\", $(now) - $t0 }")
pair_manifest "$WORK/failover.yaml" failover "$FO_N" ", unreachable_grace_s: 2"
t_start=$(now)
"$BIN" batch run --manifest "$WORK/failover.yaml" --output-dir "$WORK/failover-out" > "$WORK/failover-run.log" 2>&1 &
RUNNER=$!
wait_for 60 "the first cases to start" started_at_least failover 4
kill -9 "$(cat "$WORK/agent-a.pid")"
t_kill=$(now)
wait "$RUNNER" || fail "the batch did not complete with box-a dead (see $WORK/failover-run.log)"
t_end=$(now)
status=$("$BIN" batch status --batch-id failover --output-dir "$WORK/failover-out" --json)
field() { echo "$status" | python3 -c "import json,sys; s=json.load(sys.stdin)['status']; print($1)"; }
fo_succeeded=$(field "s['counts']['succeeded']")
fo_spilled=$(field "s['counters']['spillovers']")
fo_skipped=$(field "s['counters']['circuit_skips']")
fo_width=$(field "s['counters']['width_changes']")
fo_opened=$(field "any('box-a: circuit open' in t['message'] for t in s['timeline'])")
fo_halved=$(field "any('concurrency 4 → 2: circuit open on box-a' in t['message'] for t in s['timeline'])")
fo_dead=$(python3 scripts/journal.py record "$WORK"/failover-out/failover/cases/*/attempts/* | python3 -c '
import json, sys
records = [json.loads(l) for l in sys.stdin]
print(sum(1 for r in records if r.get("runtime_name") == "box-a"
          and (r["summary"].get("failure") or {}).get("stage") == "submit"))
')
[ "$fo_succeeded" -eq "$FO_N" ] || fail "failover: $fo_succeeded of $FO_N succeeded"
[ "$fo_spilled" -ge 1 ] || fail "failover: nothing spilled over"
[ "$fo_opened" = True ] || fail "failover: box-a's circuit never opened"
[ "$fo_halved" = True ] || fail "failover: the width never halved"
[ "$fo_skipped" -ge 1 ] || fail "failover: no dispatch skipped the open circuit"
[ "$fo_dead" -le 6 ] || fail "failover: $fo_dead dispatches went to the dead runtime"
fo_after_kill=$(awk "BEGIN { printf \"%.1f\", $t_end - $t_kill }")
fo_total=$(awk "BEGIN { printf \"%.1f\", $t_end - $t_start }")

# --- 5. a runtime dead before the batch and left down (box-a, still down from 4) ---------
pair_manifest "$WORK/left.yaml" left 8
t0=$(now)
"$BIN" batch run --manifest "$WORK/left.yaml" --output-dir "$WORK/left-out" > "$WORK/left-run.log" 2>&1 \
  || fail "dead runtime left down: the batch did not succeed (see $WORK/left-run.log)"
one_down_s=$(awk "BEGIN { printf \"%.1f\", $(now) - $t0 }")
status=$("$BIN" batch status --batch-id left --output-dir "$WORK/left-out" --json)
left_succeeded=$(field "s['counts']['succeeded']")
left_spilled=$(field "s['counters']['spillovers']")
left_retries=$(field "s['counters']['retries']")
read -r left_dead left_probes <<<"$(python3 scripts/journal.py record "$WORK"/left-out/left/cases/*/attempts/* | python3 -c '
import json, sys
records = [json.loads(l) for l in sys.stdin]
dead = [r for r in records if r.get("runtime_name") == "box-a"]
print(len(dead), sum(1 for r in dead if r["summary"].get("probe")))
')"
[ "$left_succeeded" -eq 8 ] || fail "dead runtime left down: $left_succeeded of 8 succeeded"
[ "$left_retries" -eq 0 ] || fail "dead runtime left down: $left_retries retries spent"
awk "BEGIN { exit !($one_down_s < 3 * $both_up_s) }" \
  || fail "dead runtime left down: ${one_down_s}s, not under 3x the ${both_up_s}s with both up"

echo "drill worker-kill: cases $N, finished before kill $finished_before, adopted $adopted, re-dispatched $redispatched (job purged: $lost), finished cases re-run 0, first progress ${first_progress_s}s after restart"
echo "drill single-run-kill: runs 1, adopted $single_adopted"
echo "drill engine-kill: cases $N completed, re-run 0"
echo "drill dead-runtime: cases $FO_N succeeded, spillovers $fo_spilled, dispatches to the dead runtime $fo_dead, skipped on its open circuit $fo_skipped, width changes $fo_width, batch ${fo_total}s (${fo_after_kill}s after the kill)"
echo "drill dead-runtime-left-down: cases 8 succeeded, attempts on the dead runtime $left_dead (probes $left_probes), spillovers $left_spilled, retries $left_retries, batch ${one_down_s}s against ${both_up_s}s with both up"
echo "drill: ok"
