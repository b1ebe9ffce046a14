#!/usr/bin/env bash
# `make test`: ruff, mypy strict, then the whole pytest suite against a real broker.
# Starts the "test" broker unless one it started is already running, and stops what it
# started on every exit path, so no background process outlives the run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
INSTANCE=test

echo "== ruff"; "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check .
echo "== mypy --strict"; "$VENV/bin/mypy"
# The chart and alert rules by the real tools (helm, kubernetes-validate, promtool); this also
# installs them into the cache outside the clone the first time, for the tests that use them.
echo "== test-deploy"; "$VENV/bin/python" -m tools.deploy_check

started=""
cleanup() {
  if [[ -n "$started" ]]; then "$VENV/bin/python" tools/kafka_local.py stop --instance "$INSTANCE"; fi
  # The three-broker cluster of the `cluster` tests: pytest stops it, unless pytest was killed.
  if [[ -f .kafka/pytest-cluster/cluster.json ]]; then
    "$VENV/bin/python" tools/kafka_cluster.py stop --instance pytest-cluster
  fi
}
trap cleanup EXIT INT TERM

if ! "$VENV/bin/python" tools/kafka_local.py status --instance "$INSTANCE" >/dev/null 2>&1; then
  started=yes
  "$VENV/bin/python" tools/kafka_local.py start --instance "$INSTANCE" --fresh
fi
export RECONCILER_TEST_BOOTSTRAP
RECONCILER_TEST_BOOTSTRAP=$("$VENV/bin/python" tools/kafka_local.py bootstrap --instance "$INSTANCE")
export RECONCILER_TEST_INSTANCE=$INSTANCE

echo "== pytest (broker $RECONCILER_TEST_BOOTSTRAP)"
"$VENV/bin/pytest" "$@"
