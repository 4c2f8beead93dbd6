#!/usr/bin/env bash
# Records workflow histories of representative batches for the replay tests
# (workflows/tests/replay.rs), which replay every file in workflows/tests/histories/ and fail
# on a file their EXPECTED list does not name, or a named one that is missing: list a new
# recording there.
# Existing files are kept (histories recorded by older code must keep replaying: batches
# started then may still be running); FORCE=1 re-records this pipeline's files. Files without
# the `activities-` prefix were recorded by the old local-activity pipeline and can no longer
# be recorded: never delete them. Steps 1-7 run on a namespace without the Casebatch* search
# attributes (so no upserts, like batches started before they existed); step 8 registers them
# and records `activities-searchattr-*`, whose runs upsert them.
# A replay failure means the workflow code became nondeterministic for running batches. Step 17
# records the rules for runtimes that fail or stop answering (probes, re-asking, stranding).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --workspace
BIN=$PWD/target/release/casebatch
OUT=$PWD/workflows/tests/histories
WORK=$(mktemp -d /tmp/casebatch-record.XXXXXX)
PORT=${PORT:-7391}
temporal server start-dev --headless --ip 127.0.0.1 --port "$PORT" --db-filename "$WORK/t.db" \
  --log-level error > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.1; done
ADDR=127.0.0.1:$PORT
cb() { "$BIN" "$@" --address "$ADDR"; }
show() { # batch-id run-id name (the SDK's own JSON format, which its replayer reads)
  local file="$OUT/activities-$3.json"
  if [ -f "$file" ] && [ -z "${FORCE:-}" ]; then echo "kept $3"; return; fi
  cb batch history --batch-id "$1" --output-dir "$WORK/out" ${2:+--run-id "$2"} --out "$file" > /dev/null
  echo "recorded $3"
}
done_cases() { ls "$WORK/out/$1"/cases/*/result.json 2>/dev/null | wc -l; }
first_run() { temporal workflow list --address "$ADDR" --query "WorkflowId='$1'" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["execution"]["runId"])'; }
# The retries batch `$1` (simulated): an infra failure retried, a harness crash and a failed
# verdict not, a success.
mixed_manifest() {
  cat > "$WORK/$1.yaml" <<YAML
batch_id: $1
defaults: {runtime: fake, max_retries: 2, concurrency: 3}
tasks:
  - {task_id: flaky, fake: {infra_failures_first: 1}}
  - {task_id: crash, fake: {outcome: harness_error}}
  - {task_id: verdict-fail, fake: {outcome: fail}}
  - {task_id: ok}
YAML
}
# The crashed-runner batch `$1`: 18 local-process cases of 1-3 s at 6 in flight, the runner
# SIGKILLed after 2, 6 and 11 cases ended and resumed each time, then run to the end. The
# binary itself runs in the background (not through `cb`, a function: its subshell would
# take the SIGKILL and leave the runner alive).
crash_batch() {
  python3 - "$WORK/$1.yaml" "$1" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write(f"batch_id: {sys.argv[2]}\ndefaults: {{runtime: local-process, concurrency: 6, max_retries: 1}}\ntasks:\n")
    for i in range(18):
        f.write(f"  - {{task_id: c{i}, harness: 'sleep {1 + i % 3}; echo {{}} > \"$CASEBATCH_RESULT\"'}}\n")
PY
  "$BIN" batch run --manifest "$WORK/$1.yaml" --output-dir "$WORK/out" --address "$ADDR" \
    > "$WORK/$1-0.log" 2>&1 & RUNNER=$!
  for kill_at in 2 6 11; do
    for _ in $(seq 1 600); do [ "$(done_cases "$1")" -ge "$kill_at" ] && break; sleep 0.1; done
    kill -9 "$RUNNER"; wait "$RUNNER" 2>/dev/null || true
    "$BIN" batch resume --batch-id "$1" --output-dir "$WORK/out" --address "$ADDR" \
      > "$WORK/$1-$kill_at.log" 2>&1 & RUNNER=$!
  done
  wait "$RUNNER"
  grep -q "18 succeeded" "$WORK/$1-11.log" || { cat "$WORK/$1-11.log"; exit 1; }
}
# Fails unless the recorded history `$1` (a name as `show` takes it) holds the patch marker
# `$2` (its id is inside a base64 payload).
has_patch() {
  python3 - "$OUT/activities-$1.json" "$2" <<'PY' || { echo "no $2 patch marker in $1"; exit 1; }
import base64, json, sys
events = json.load(open(sys.argv[1]))["events"]
ids = [json.loads(base64.b64decode(p["data"]))["id"]
       for e in events
       for p in e["attributes"].get("MarkerRecordedEventAttributes", {}).get("details", {}).get("patch-data", {}).get("payloads", [])]
sys.exit(0 if sys.argv[2] in ids else 1)
PY
}

# STEP=18 records only step 18 (each step before it runs whole batches again just to keep
# the files it finds).
if [ "${STEP:-all}" = all ]; then

# 1. A completed local-process batch with an evaluator.
cb batch run --manifest examples/batch-local.yaml --output-dir "$WORK/out" > /dev/null
show local-example "" completed-local

# 2. Retries by class: infra retried, harness/agent not.
mixed_manifest mixed
cb batch run --manifest "$WORK/mixed.yaml" --output-dir "$WORK/out" > /dev/null || true
show mixed "" retries

# 3. Drain, then resume (two runs), and 4. cancel.
cat > "$WORK/slow.yaml" <<'YAML'
batch_id: slow
defaults: {runtime: local-process, concurrency: 1, harness: 'sleep 1'}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}]
YAML
cb batch run --manifest "$WORK/slow.yaml" --output-dir "$WORK/out" > /dev/null & RUNNER=$!
sleep 0.5; cb batch drain --batch-id slow --output-dir "$WORK/out" > /dev/null
wait $RUNNER || true
cb batch resume --batch-id slow --output-dir "$WORK/out" > /dev/null
show slow "$(first_run casebatch-slow)" drained
show slow "" resumed

cat > "$WORK/cancel.yaml" <<'YAML'
batch_id: cancelled
defaults: {runtime: local-process, concurrency: 2, harness: 'sleep 60'}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}]
YAML
cb batch run --manifest "$WORK/cancel.yaml" --output-dir "$WORK/out" > /dev/null & RUNNER=$!
sleep 1; cb batch pause --batch-id cancelled --output-dir "$WORK/out" > /dev/null
cb batch unpause --batch-id cancelled --output-dir "$WORK/out" > /dev/null
cb batch cancel --batch-id cancelled --output-dir "$WORK/out" > /dev/null
wait $RUNNER || true
show cancelled "" cancelled

# 5. Continue-as-new: the first segment of a batch with a tiny history budget.
python3 - "$WORK/can.yaml" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("batch_id: segments\ndefaults: {runtime: fake, concurrency: 8}\ntasks:\n")
    for i in range(60):
        f.write(f"  - task_id: s{i}\n")
PY
cb batch run --manifest "$WORK/can.yaml" --output-dir "$WORK/out" --history-budget 150 > /dev/null
show segments "$(first_run casebatch-segments)" continued-as-new

# 6. In-batch OOM auto-boost: 64 -> 128 -> 256 MB inside one run.
cat > "$WORK/boost.yaml" <<'YAML'
batch_id: boost
defaults:
  runtime: local-process
  max_retries: 0
  oom_auto_boost: true
  resources: {memory_mb: 64}
  harness: 'python3 -c "b = bytearray(150 * 1024 * 1024)"'
tasks: [{task_id: hog}, {task_id: light, harness: 'true'}]
YAML
cb batch run --manifest "$WORK/boost.yaml" --output-dir "$WORK/out" > /dev/null
show boost "" oom-auto-boost

# 7. Crashed runs: the runner SIGKILLed three times mid-batch (cases' activities in flight,
# its status queries arriving), resumed after each kill, then run to the end. The whole
# history, with every crash in it, must replay.
crash_batch crashed
show crashed "" crashed-runner

# 8. Search attributes: everything above ran on a namespace without the Casebatch* attributes
# (no upserts: the histories of batches started before they existed). Now register them, so
# the runner enables upserts (BatchInput.search_attributes and the search-attributes patch).
for attr in CasebatchBatchId=Keyword CasebatchOutcome=Keyword CasebatchSucceeded=Int CasebatchFailed=Int; do
  temporal operator search-attribute create --address "$ADDR" --name "${attr%=*}" --type "${attr#*=}" > /dev/null
done
for _ in $(seq 1 100); do
  [ "$(temporal operator search-attribute list --address "$ADDR" | grep -c Casebatch)" -eq 4 ] && break; sleep 0.1
done
sed 's/batch_id: mixed/batch_id: sa-mixed/' "$WORK/mixed.yaml" > "$WORK/sa-mixed.yaml"
cb batch run --manifest "$WORK/sa-mixed.yaml" --output-dir "$WORK/out" > /dev/null || true
show sa-mixed "" searchattr-retries

sed 's/batch_id: slow/batch_id: sa-slow/' "$WORK/slow.yaml" > "$WORK/sa-slow.yaml"
cb batch run --manifest "$WORK/sa-slow.yaml" --output-dir "$WORK/out" > /dev/null & RUNNER=$!
sleep 0.5; cb batch pause --batch-id sa-slow --output-dir "$WORK/out" > /dev/null
for _ in $(seq 1 100); do [ "$(done_cases sa-slow)" -ge 1 ] && break; sleep 0.1; done
sleep 0.5; cb batch drain --batch-id sa-slow --output-dir "$WORK/out" > /dev/null
wait $RUNNER || true
cb batch resume --batch-id sa-slow --output-dir "$WORK/out" > /dev/null
show sa-slow "$(first_run casebatch-sa-slow)" searchattr-paused-drained
show sa-slow "" searchattr-resumed

sed 's/batch_id: segments/batch_id: sa-segments/' "$WORK/can.yaml" > "$WORK/sa-can.yaml"
cb batch run --manifest "$WORK/sa-can.yaml" --output-dir "$WORK/out" --history-budget 150 > /dev/null
show sa-segments "$(first_run casebatch-sa-segments)" searchattr-continued-as-new
for f in searchattr-retries searchattr-paused-drained searchattr-resumed searchattr-continued-as-new; do
  grep -q CasebatchOutcome "$OUT/activities-$f.json" || { echo "no upsert in $f"; exit 1; }
done

# 8b. Upserts at most once per 10 s of workflow time (the upserts-throttled patch) and a heartbeat
# cadence of its own, over a batch longer than one throttle period.
python3 - "$WORK/sa-throttled.yaml" <<'PY'
import sys
tasks = "".join(f"  - task_id: t{i}\n" for i in range(24))
with open(sys.argv[1], "w") as f:
    f.write("batch_id: sa-throttled\ndefaults: {runtime: local-process, concurrency: 4, "
            "heartbeat_every_seconds: 1, harness: 'sleep 2'}\ntasks:\n" + tasks)
PY
cb batch run --manifest "$WORK/sa-throttled.yaml" --output-dir "$WORK/out" > /dev/null
show sa-throttled "" searchattr-throttled
python3 - "$OUT/activities-searchattr-throttled.json" <<'PY' || { echo "no throttle patch"; exit 1; }
import base64, json, sys
events = json.load(open(sys.argv[1]))["events"]
payloads = [p["data"] for e in events if e["event_type"] == 25
            for p in e["attributes"]["MarkerRecordedEventAttributes"]["details"].get("patch-data", {}).get("payloads", [])]
sys.exit(0 if any(b"upserts-throttled" in base64.b64decode(d) for d in payloads) else 1)
PY

# 9. A batch on a runtime agent (stateless workers: every stage on the shared queue), whose
# runner is SIGKILLed while the agent's jobs run and resumed: the jobs are adopted through the
# agent. Its history carries the agent's JobRefs (`runtime: <name>`, no host queue).
AGENT_DIR="$WORK/agent"; mkdir -p "$AGENT_DIR"
"$BIN" agent --listen 127.0.0.1:0 --data-dir "$AGENT_DIR" > "$WORK/agent.log" 2>&1 & AGENT=$!
trap 'kill $SERVER $AGENT 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 1 100); do [ -s "$AGENT_DIR/agent.addr" ] && break; sleep 0.1; done
python3 - "$WORK/agent.yaml" "$(cat "$AGENT_DIR/agent.addr")" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write(f"batch_id: on-agent\nruntimes: {{box: {{kind: agent, endpoint: 'http://{sys.argv[2]}'}}}}\n")
    f.write("defaults: {runtime: box, concurrency: 4}\ntasks:\n")
    for i in range(8):
        f.write(f"  - {{task_id: a{i}, harness: 'sleep {1 + i % 2}; echo {{}} > \"$CASEBATCH_RESULT\"'}}\n")
PY
"$BIN" batch run --manifest "$WORK/agent.yaml" --output-dir "$WORK/out" --address "$ADDR" \
  > "$WORK/agent-0.log" 2>&1 & RUNNER=$!
for _ in $(seq 1 600); do [ "$(done_cases on-agent)" -ge 2 ] && break; sleep 0.1; done
kill -9 "$RUNNER"; wait "$RUNNER" 2>/dev/null || true
cb batch resume --batch-id on-agent --output-dir "$WORK/out" > "$WORK/agent-1.log"
grep -q "8 succeeded" "$WORK/agent-1.log" || { cat "$WORK/agent-1.log"; exit 1; }
show on-agent "" agent-crashed-runner

# 10. Operated while running: the checked operations (updates, each through its validator),
# one refused (no event), and set_concurrency once as a plain signal from the stock CLI.
cat > "$WORK/operated.yaml" <<'YAML'
batch_id: operated
defaults: {runtime: local-process, concurrency: 1, harness: 'sleep 1'}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}, {task_id: d}, {task_id: e}, {task_id: f}]
YAML
cb batch run --manifest "$WORK/operated.yaml" --output-dir "$WORK/out" > /dev/null & RUNNER=$!
op() { cb batch "$1" --batch-id operated --output-dir "$WORK/out" "${@:2}" > /dev/null; }
for _ in $(seq 1 100); do op status 2>/dev/null && break; sleep 0.1; done
if op unpause 2>/dev/null; then echo "unpause of a running batch was not refused"; exit 1; fi
op pause
op set-concurrency 3
op unpause
temporal workflow signal --address "$ADDR" --workflow-id casebatch-operated \
  --name set_concurrency --input 2 > /dev/null
op drain
wait $RUNNER || true
show operated "" operated

# 11. Runtime envelopes: two simulated runtimes declaring max_concurrent and a memory budget,
# the cases dealt to them in turn; the workflow holds back what does not fit.
cat > "$WORK/enveloped.yaml" <<'YAML'
batch_id: enveloped
runtimes:
  sim-a: {kind: fake, max_concurrent: 1}
  sim-b: {kind: fake, memory_budget_mb: 600}
defaults:
  runtime: [sim-a, sim-b]
  concurrency: 4
  resources: {memory_mb: 512}
  fake: {duration_ms: 300}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}, {task_id: d}, {task_id: e}, {task_id: f}]
YAML
cb batch run --manifest "$WORK/enveloped.yaml" --output-dir "$WORK/out" > /dev/null
show enveloped "" enveloped

# 12. Failover: a runtime list whose first runtime is dead (nothing listens there). Its cases
# fail to dispatch and spill to the live agent, its circuit opens (later cases skip it), the
# batch runs at half width, and after the cooldown a probe fails and re-arms the circuit. The
# history of the dead runtime's breaker (a `RuntimeBreaker` workflow) is recorded too.
python3 - "$WORK/failover.yaml" "$(cat "$AGENT_DIR/agent.addr")" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("batch_id: failover\nruntimes:\n")
    f.write("  dead: {kind: agent, endpoint: 'http://127.0.0.1:1', unreachable_grace_s: 1, breaker_failures: 2, breaker_cooldown_s: 3}\n")
    f.write(f"  box: {{kind: agent, endpoint: 'http://{sys.argv[2]}'}}\n")
    f.write("defaults: {runtime: [dead, box], concurrency: 2}\ntasks:\n")
    for i in range(16):
        f.write(f"  - {{task_id: f{i}, harness: 'sleep 0.5; echo {{}} > \"$CASEBATCH_RESULT\"'}}\n")
PY
cb batch run --manifest "$WORK/failover.yaml" --output-dir "$WORK/out" > "$WORK/failover.log"
grep -q "16 succeeded" "$WORK/failover.log" || { cat "$WORK/failover.log"; exit 1; }
show failover "" failover
if [ ! -f "$OUT/breaker-failover.json" ] || [ -n "${FORCE:-}" ]; then
  # Ended first (it would idle for 10 minutes), so the recorded history is complete.
  BREAKER=$(temporal workflow list --address "$ADDR" --query "WorkflowType='RuntimeBreaker'" -o json \
    | python3 -c 'import json,sys; print([w for w in json.load(sys.stdin) if "-dead-" in w["execution"]["workflowId"]][0]["execution"]["workflowId"])')
  temporal workflow terminate --address "$ADDR" --workflow-id "$BREAKER" --reason recorded > /dev/null
  cb batch history --batch-id failover --output-dir "$WORK/out" --breaker dead \
    --out "$OUT/breaker-failover.json" > /dev/null
  echo "recorded breaker-failover"
fi

# 12b. A batch started while a runtime's circuit is already open: its dispatches there are
# skipped by the breaker (`Skipped`) and go to the next runtime of the list untried.
python3 - "$WORK/late.yaml" "$(cat "$AGENT_DIR/agent.addr")" <<'PY'
import sys
for batch, n in (("trip", 1), ("late", 4)):
    with open(sys.argv[1].replace("late", batch), "w") as f:
        f.write(f"batch_id: {batch}\nruntimes:\n")
        f.write("  dead2: {kind: agent, endpoint: 'http://127.0.0.1:2', unreachable_grace_s: 1, breaker_failures: 1, breaker_cooldown_s: 600}\n")
        f.write(f"  box: {{kind: agent, endpoint: 'http://{sys.argv[2]}'}}\n")
        f.write("defaults: {runtime: [dead2, box], concurrency: 2}\ntasks:\n")
        for i in range(n):
            f.write(f"  - {{task_id: l{i}, harness: 'echo {{}} > \"$CASEBATCH_RESULT\"'}}\n")
PY
cb batch run --manifest "$WORK/trip.yaml" --output-dir "$WORK/out" > /dev/null
cb batch run --manifest "$WORK/late.yaml" --output-dir "$WORK/out" > "$WORK/late.log"
grep -q "4 succeeded" "$WORK/late.log" || { cat "$WORK/late.log"; exit 1; }
show late "" breaker-skipped

# 13. Superseded: a batch of sleeping jobs on the agent, superseded mid-run (kill by batch),
# then replaced by a new run (`batch run --supersede`) that re-runs the killed cases.
cat > "$WORK/stale.yaml" <<YAML
batch_id: stale
runtimes: {box: {kind: agent, endpoint: 'http://$(cat "$AGENT_DIR/agent.addr")'}}
defaults: {runtime: box, concurrency: 3}
tasks:
  - {task_id: quick, harness: 'echo {} > "\$CASEBATCH_RESULT"'}
  - {task_id: s1, harness: 'test -e $WORK/fast || sleep 30; echo {} > "\$CASEBATCH_RESULT"'}
  - {task_id: s2, harness: 'test -e $WORK/fast || sleep 30; echo {} > "\$CASEBATCH_RESULT"'}
YAML
cb batch run --manifest "$WORK/stale.yaml" --output-dir "$WORK/out" > /dev/null & RUNNER=$!
for _ in $(seq 1 300); do [ "$(done_cases stale)" -ge 1 ] && [ "$(ls -d "$WORK"/out/stale/cases/s*/attempts/1 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
sleep 1
touch "$WORK/fast"
cb batch run --manifest "$WORK/stale.yaml" --output-dir "$WORK/out" --supersede > "$WORK/stale.log"
wait $RUNNER || true
grep -q "3 succeeded" "$WORK/stale.log" || { cat "$WORK/stale.log"; exit 1; }
show stale "$(first_run casebatch-stale)" superseded

# 14. Tail speculation: a list of the agent and this host; the agent's share sleeps past the
# 10 s floor, so once every case is dispatched the batch asks those stragglers to speculate:
# each gets a duplicate on local-process, which wins, and the agent's job is cancelled and
# cleaned up as the speculative loser. The tail timer and the race must replay.
cat > "$WORK/tail.yaml" <<YAML
batch_id: tail
runtimes: {box: {kind: agent, endpoint: 'http://$(cat "$AGENT_DIR/agent.addr")'}}
defaults:
  runtime: [box, local-process]
  concurrency: 4
  harness: 'case "\$CASEBATCH_RESULT" in $AGENT_DIR*) sleep 13;; *) sleep 0.5;; esac; echo {} > "\$CASEBATCH_RESULT"'
tasks: [{task_id: t0}, {task_id: t1}, {task_id: t2}, {task_id: t3}]
YAML
cb batch run --manifest "$WORK/tail.yaml" --output-dir "$WORK/out" > "$WORK/tail.log"
grep -q "4 succeeded" "$WORK/tail.log" || { cat "$WORK/tail.log"; exit 1; }
grep -q "tail speculations 2 (duplicate won 2)" "$WORK/tail.log" || { cat "$WORK/tail.log"; exit 1; }
show tail "" speculated

# 15. settle closes final attempts (the `settle-closes-final-attempts` patch): the retries
# batch again, where success, harness crash and verdict fail close in `settle` and the infra
# failure takes a `cleanup` before its retry; then the crashed-runner batch again, so runner
# SIGKILLs land while settles are closing attempts.
sed 's/^batch_id: mixed/batch_id: closed-mixed/' "$WORK/mixed.yaml" > "$WORK/closed-mixed.yaml"
cb batch run --manifest "$WORK/closed-mixed.yaml" --output-dir "$WORK/out" > /dev/null || true
show closed-mixed "" closed-on-settle
crash_batch closed-crashed
show closed-crashed "" closed-crashed-runner
for f in closed-on-settle closed-crashed-runner; do has_patch "$f" settle-closes-final-attempts; done

# 16. Provision ahead (`prepare_ahead`): a batch of slow-to-provision simulated sandboxes run
# one at a time with two provisioned ahead (granted slots as they free up); then the same
# drained, and cancelled, while two wait provisioned: their environments are released.
cat > "$WORK/ahead.yaml" <<'YAML'
batch_id: ahead
defaults: {runtime: fake, concurrency: 1, prepare_ahead: 2, fake: {duration_ms: 300, provision_ms: 200}}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}, {task_id: d}, {task_id: e}]
YAML
cb batch run --manifest "$WORK/ahead.yaml" --output-dir "$WORK/out" > "$WORK/ahead.log"
grep -q "provisioned ahead 4 · released unused 0" "$WORK/ahead.log" || { cat "$WORK/ahead.log"; exit 1; }
show ahead "" prepared-ahead
prepared() { python3 scripts/journal.py prepared "$WORK/out/$1"/cases/*/attempts/1 | wc -l; }
for end in drain cancel; do
  sed -e "s/^batch_id: ahead/batch_id: ahead-$end/" -e 's/duration_ms: 300/duration_ms: 4000/' \
    "$WORK/ahead.yaml" > "$WORK/ahead-$end.yaml"
  cb batch run --manifest "$WORK/ahead-$end.yaml" --output-dir "$WORK/out" > "$WORK/ahead-$end.log" & RUNNER=$!
  for _ in $(seq 1 300); do [ "$(prepared "ahead-$end")" -ge 2 ] && break; sleep 0.1; done
  cb batch "$end" --batch-id "ahead-$end" --output-dir "$WORK/out" > /dev/null
  wait $RUNNER || true
  grep -q "released unused 2" "$WORK/ahead-$end.log" || { cat "$WORK/ahead-$end.log"; exit 1; }
done
show ahead-drain "" prepared-drained
show ahead-cancel "" prepared-cancelled

# 17. The rules for runtimes that fail or stop answering (the `runtime-outage-rules` patch).
# a. A runtime list whose first runtime is dead throughout, with a 1 s cooldown: probes go
#    through mid-batch, fail, and move their cases on without spending retries.
python3 - "$WORK/outage-dead.yaml" "$(cat "$AGENT_DIR/agent.addr")" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("batch_id: outage-dead\nruntimes:\n")
    f.write("  dead3: {kind: agent, endpoint: 'http://127.0.0.1:3', breaker_cooldown_s: 1}\n")
    f.write(f"  box: {{kind: agent, endpoint: 'http://{sys.argv[2]}'}}\n")
    f.write("defaults: {runtime: [dead3, box], concurrency: 4, max_retries: 2}\ntasks:\n")
    for i in range(16):
        f.write(f"  - {{task_id: d{i}, harness: 'sleep 1; echo {{}} > \"$CASEBATCH_RESULT\"'}}\n")
PY
cb batch run --manifest "$WORK/outage-dead.yaml" --output-dir "$WORK/out" > "$WORK/outage-dead.log"
grep -q "16 succeeded" "$WORK/outage-dead.log" || { cat "$WORK/outage-dead.log"; exit 1; }
python3 scripts/journal.py record "$WORK"/out/outage-dead/cases/*/attempts/* | grep -q '"probe": true' \
  || { echo "no probe in outage-dead"; exit 1; }
show outage-dead "" outage-probes-spill
# b. The agent frozen (SIGSTOP) past its grace under a batch with nowhere else to go: each
#    attempt asks again about its job, which ended meanwhile, and settles from it.
# c. The same freeze under a list `[box, local-process]`: the agent's cases move on, their
#    attempts stranded and cleaned up once the agent answers.
for shape in single list; do
  runtime=box; batch=outage-frozen
  [ "$shape" = list ] && { runtime="[box, local-process]"; batch=outage-stranded; }
  cat > "$WORK/$batch.yaml" <<YAML
batch_id: $batch
runtimes: {box: {kind: agent, endpoint: 'http://$(cat "$AGENT_DIR/agent.addr")', unreachable_grace_s: 2}}
defaults:
  runtime: $runtime
  concurrency: 4
  harness: 'echo x >> $WORK/$batch.started; sleep 3; echo {} > "\$CASEBATCH_RESULT"'
tasks: [{task_id: z0}, {task_id: z1}, {task_id: z2}, {task_id: z3}]
YAML
  cb batch run --manifest "$WORK/$batch.yaml" --output-dir "$WORK/out" --no-speculation \
    > "$WORK/$batch.log" & RUNNER=$!
  for _ in $(seq 1 300); do [ "$(cat "$WORK/$batch.started" 2>/dev/null | wc -l)" -ge 4 ] && break; sleep 0.1; done
  sleep 1
  kill -STOP "$AGENT"; sleep 45; kill -CONT "$AGENT"
  wait $RUNNER
  grep -q "4 succeeded" "$WORK/$batch.log" || { cat "$WORK/$batch.log"; exit 1; }
done
grep -q "jobs asked about again [1-9]" "$WORK/outage-frozen.log" || { cat "$WORK/outage-frozen.log"; exit 1; }
grep -q "attempts stranded 2" "$WORK/outage-stranded.log" || { cat "$WORK/outage-stranded.log"; exit 1; }
show outage-frozen "" outage-reattached
show outage-stranded "" outage-stranded
for f in outage-probes-spill outage-reattached outage-stranded; do has_patch "$f" runtime-outage-rules; done

fi

# 18. `start` settles short jobs (the `start-settles-short-jobs` patch): simulated outcomes
# that all settle in `start` (success, harness crash and verdict fail closed there; the infra
# failure settled there, then a `cleanup` and its retry) beside a job past the watch (started,
# then settled as ever); then local processes of 1-3 s with the runner SIGKILLed three times,
# so kills land while `start`s watch their jobs.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 18 ]; then
mixed_manifest short-mixed
echo "  - {task_id: long, fake: {duration_ms: 3500}}" >> "$WORK/short-mixed.yaml"
cb batch run --manifest "$WORK/short-mixed.yaml" --output-dir "$WORK/out" > /dev/null || true
show short-mixed "" start-settled
crash_batch short-crashed
show short-crashed "" start-settled-crashed-runner
for f in start-settled start-settled-crashed-runner; do has_patch "$f" start-settles-short-jobs; done
fi

# 19. A budget over the usage harnesses report: cases of $1 each at 2 in flight under a $3
# budget, so admissions stop (each running case reserved at the p90 of finished ones) and the
# run ends `budget_exhausted`; then `resume --budget` raises it and the batch completes.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 19 ]; then
cat > "$WORK/budget.yaml" <<YAML
batch_id: budget
defaults:
  runtime: local-process
  concurrency: 2
  budget: {cost_usd: 3}
  harness: 'sleep 0.5; echo "{\"usage\": {\"cost_usd\": 1.0, \"input_tokens\": 10}}" > "\$CASEBATCH_RESULT"'
tasks: [{task_id: u0}, {task_id: u1}, {task_id: u2}, {task_id: u3}, {task_id: u4}, {task_id: u5}, {task_id: u6}, {task_id: u7}]
YAML
cb batch run --manifest "$WORK/budget.yaml" --output-dir "$WORK/out" > "$WORK/budget.log" || true
grep -q "budget exhausted" "$WORK/budget.log" || { cat "$WORK/budget.log"; exit 1; }
cb batch resume --batch-id budget --output-dir "$WORK/out" --budget cost_usd=100 > "$WORK/budget-resumed.log"
grep -q "8 succeeded" "$WORK/budget-resumed.log" || { cat "$WORK/budget-resumed.log"; exit 1; }
show budget "$(first_run casebatch-budget)" budget-exhausted
show budget "" budget-resumed
fi

# 20. Rate limits (the `rate-limit-rules` patch): harnesses refused for their rate on their
# first two attempts, asking for 1 s (`retry_after_s`), then for nothing (exponential backoff
# with jitter): each waits on a timer, on a cap of its own; the width is cut and restored.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 20 ]; then
cat > "$WORK/ratelimited.yaml" <<YAML
batch_id: ratelimited
defaults:
  runtime: local-process
  concurrency: 3
  max_retries: 0
  harness: 'case \$CASEBATCH_ATTEMPT in 1) echo "{\"failure\": {\"class\": \"infra\", \"code\": \"RATE_LIMITED\", \"retryable\": true, \"retry_after_s\": 1}}" > "\$CASEBATCH_RESULT"; exit 1;; 2) echo "{\"failure\": {\"class\": \"infra\", \"code\": \"RATE_LIMITED\", \"retryable\": true}}" > "\$CASEBATCH_RESULT"; exit 1;; esac; echo {} > "\$CASEBATCH_RESULT"'
tasks: [{task_id: q0}, {task_id: q1}, {task_id: q2}, {task_id: q3}, {task_id: q4}]
YAML
cb batch run --manifest "$WORK/ratelimited.yaml" --output-dir "$WORK/out" > "$WORK/ratelimited.log"
grep -q "5 succeeded" "$WORK/ratelimited.log" || { cat "$WORK/ratelimited.log"; exit 1; }
show ratelimited "" rate-limited
has_patch rate-limited rate-limit-rules
fi

# 21. Paces (`defaults.rate`): a batch on its own pace (a timer to each start that does not
# conform yet), and two batches sharing a `rate_key` (each start booked on the key's
# `RatePacer` by a `reserve_start` activity); the pacer's own history is recorded too.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 21 ]; then
paced_manifest() { # batch-id rate
  cat > "$WORK/$1.yaml" <<YAML
batch_id: $1
defaults:
  runtime: local-process
  concurrency: 4
  rate: $2
  harness: 'echo {} > "\$CASEBATCH_RESULT"'
tasks: [{task_id: p0}, {task_id: p1}, {task_id: p2}, {task_id: p3}, {task_id: p4}]
YAML
}
paced_manifest paced "{starts_per_minute: 120}"
cb batch run --manifest "$WORK/paced.yaml" --output-dir "$WORK/out" > "$WORK/paced.log"
grep -q "5 succeeded" "$WORK/paced.log" || { cat "$WORK/paced.log"; exit 1; }
show paced "" paced
paced_manifest shared-a "{starts_per_minute: 120, rate_key: histories}"
paced_manifest shared-b "{starts_per_minute: 120, rate_key: histories}"
cb batch run --manifest "$WORK/shared-a.yaml" --output-dir "$WORK/out" > "$WORK/shared-a.log" & OTHER=$!
cb batch run --manifest "$WORK/shared-b.yaml" --output-dir "$WORK/out" > "$WORK/shared-b.log"
wait "$OTHER"
for b in shared-a shared-b; do grep -q "5 succeeded" "$WORK/$b.log" || { cat "$WORK/$b.log"; exit 1; }; done
show shared-a "" paced-shared
if [ ! -f "$OUT/pacer-shared.json" ] || [ -n "${FORCE:-}" ]; then
  cb batch history --batch-id shared-a --output-dir "$WORK/out" --pace --out "$OUT/pacer-shared.json" > /dev/null
  echo "recorded pacer-shared"
fi
fi

# 22. The closing write of the batch files as a regular activity (the `finalize-as-activity`
# patch): a simulated batch with a retried infra failure, a harness crash, a failed verdict
# and a success, run to its end.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 22 ]; then
mixed_manifest finalized
cb batch run --manifest "$WORK/finalized.yaml" --output-dir "$WORK/out" > /dev/null || true
show finalized "" finalized
has_patch finalized finalize-as-activity
fi

# 23. Two users' batches sharing one agent of 2 slots (`RuntimeSlots`): cases ask for a slot,
# wait for the grant signal and give it back from `settle` (the patch
# slot-returns-by-activity; `activities-shared-slots.json` was recorded before it, when the
# batch signalled the slots too). The batch of one, and the agent's slots.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 23 ]; then
SLOTS_DIR="$WORK/slots-agent"; mkdir -p "$SLOTS_DIR"
"$BIN" agent --listen 127.0.0.1:0 --data-dir "$SLOTS_DIR" --max-concurrent 2 > "$WORK/slots-agent.log" 2>&1 & SLOTS_AGENT=$!
for _ in $(seq 1 100); do [ -s "$SLOTS_DIR/agent.addr" ] && break; sleep 0.1; done
for b in shared-slots-a shared-slots-b; do
  cat > "$WORK/$b.yaml" <<YAML
batch_id: $b
runtimes: {box: {kind: agent, endpoint: 'http://$(cat "$SLOTS_DIR/agent.addr")'}}
defaults: {runtime: box, concurrency: 4, harness: 'sleep 1; echo {} > "\$CASEBATCH_RESULT"'}
tasks: [{task_id: s0}, {task_id: s1}, {task_id: s2}, {task_id: s3}, {task_id: s4}, {task_id: s5}]
YAML
done
USER=ann cb batch run --manifest "$WORK/shared-slots-a.yaml" --output-dir "$WORK/out" > "$WORK/shared-slots-a.log" & OTHER=$!
USER=bob cb batch run --manifest "$WORK/shared-slots-b.yaml" --output-dir "$WORK/out" > "$WORK/shared-slots-b.log"
wait "$OTHER"
for b in shared-slots-a shared-slots-b; do grep -q "6 succeeded" "$WORK/$b.log" || { cat "$WORK/$b.log"; exit 1; }; done
show shared-slots-a "" shared-slots-returned
has_patch shared-slots-returned slot-returns-by-activity
if [ ! -f "$OUT/slots-shared.json" ] || [ -n "${FORCE:-}" ]; then
  cb batch history --batch-id shared-slots-a --output-dir "$WORK/out" --slots box --out "$OUT/slots-shared.json" > /dev/null
  echo "recorded slots-shared"
fi
kill "$SLOTS_AGENT" 2>/dev/null || true
fi

# 24. Backpressure: a batch whose agent's `queue_limit` (2) is reached waits to be admitted
# (it asks the queue, sleeps, asks again), then runs once the other batch's gate opens.
if [ "${STEP:-all}" = all ] || [ "${STEP:-}" = 24 ]; then
LIMIT_DIR="$WORK/limit-agent"; mkdir -p "$LIMIT_DIR"
"$BIN" agent --listen 127.0.0.1:0 --data-dir "$LIMIT_DIR" --max-concurrent 1 > "$WORK/limit-agent.log" 2>&1 & LIMIT_AGENT=$!
for _ in $(seq 1 100); do [ -s "$LIMIT_DIR/agent.addr" ] && break; sleep 0.1; done
for b in queue-first:'' queue-held:', queue_limit: 2'; do
  cat > "$WORK/${b%%:*}.yaml" <<YAML
batch_id: ${b%%:*}
runtimes: {box: {kind: agent, endpoint: 'http://$(cat "$LIMIT_DIR/agent.addr")'${b#*:}}}
defaults: {runtime: box, concurrency: 4, harness: 'while [ ! -e "$WORK/queue-gate" ]; do sleep 0.05; done; echo {} > "\$CASEBATCH_RESULT"'}
tasks: [{task_id: q0}, {task_id: q1}, {task_id: q2}, {task_id: q3}]
YAML
done
USER=ann cb batch run --manifest "$WORK/queue-first.yaml" --output-dir "$WORK/out" > "$WORK/queue-first.log" & OTHER=$!
until cb batch status --batch-id queue-first --output-dir "$WORK/out" 2>/dev/null | grep -q "3 waiting"; do sleep 0.2; done
USER=bob cb batch run --manifest "$WORK/queue-held.yaml" --output-dir "$WORK/out" > "$WORK/queue-held.log" & HELD=$!
until cb batch status --batch-id queue-held --output-dir "$WORK/out" 2>/dev/null | grep -q "waiting to be admitted"; do sleep 0.2; done
touch "$WORK/queue-gate"
wait "$OTHER" "$HELD"
for b in queue-first queue-held; do grep -q "4 succeeded" "$WORK/$b.log" || { cat "$WORK/$b.log"; exit 1; }; done
show queue-held "" queue-limit-held
kill "$LIMIT_AGENT" 2>/dev/null || true
fi
