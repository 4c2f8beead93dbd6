#!/usr/bin/env bash
# The container engine the container-runtime tests run against, on this machine: podman's
# Docker-compatible API service on a socket of its own (scripts/container-engine/containers.conf:
# runc, and no default ulimits, which casebatch sets per container), and the tests' image, a
# few-MB busybox built from the host's static busybox, so no registry is needed (built with the
# deploy drill's settings: a build's RUN step gets podman's default ulimits, refused here).
# Idempotent; prints the DOCKER_HOST value to export.
#   export DOCKER_HOST=$(bash scripts/container-engine.sh)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${CASEBATCH_PODMAN_DIR:-/tmp/casebatch-podman}"
sock="unix://$dir/podman.sock"
image="localhost/casebatch-test-busybox:1"
answers() { podman --url "$sock" version >/dev/null 2>&1; }
if ! answers; then
  mkdir -p "$dir"
  # Detached from this shell: the service outlives the script, serving the test run.
  CONTAINERS_CONF="$repo/scripts/container-engine/containers.conf" \
    setsid nohup podman system service --time=0 "$sock" >"$dir/service.log" 2>&1 < /dev/null &
  for _ in $(seq 100); do answers && break; sleep 0.1; done
  answers || { cat "$dir/service.log" >&2; echo "podman's service did not answer at $sock" >&2; exit 1; }
fi

if ! podman image exists "$image"; then
  busybox="$(command -v busybox)" || { echo "no busybox (Debian: apt-get install busybox-static)" >&2; exit 1; }
  ctx="$(mktemp -d)"
  trap 'rm -rf "$ctx"' EXIT
  cp "$busybox" "$ctx/busybox"
  printf 'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n' >"$ctx/Containerfile"
  CONTAINERS_CONF="$repo/scripts/deploy-drill/containers.conf" podman build -q -t "$image" "$ctx" >/dev/null
fi
echo "$sock"
