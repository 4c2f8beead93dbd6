#!/usr/bin/env bash
# Checks deploy/ against the schemas it must satisfy, offline: the Kubernetes manifests with
# kubernetes-validate (strict: unknown fields are errors) and the compose files with
# check-jsonschema's vendored compose specification. Both come from PyPI, into a venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VALIDATE_VENV:-${TMPDIR:-/tmp}/casebatch-validate-deploy}
if [ ! -x "$VENV/bin/check-jsonschema" ] || [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate check-jsonschema
fi
"$VENV/bin/kubernetes-validate" --strict --quiet deploy/k8s/*.yaml
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml deploy/compose.agent.yaml \
  scripts/deploy-drill/compose.yaml
echo "deploy/: Kubernetes and compose files match their schemas"
