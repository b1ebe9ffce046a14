#!/usr/bin/env bash
# `make test`: ruff, mypy strict and the deploy checks (beside the compiled build, when `make`
# passes SETUP_CMD), then the whole pytest suite: the tests that need no broker on both cores,
# then the Kafka tests against a real broker. With arguments, one pytest run of exactly those.
# Starts the "test" broker unless one it started is already running, and stops what it
# started on every exit path, so no background process outlives the run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
INSTANCE=test

started=""
build=""
cleanup() {
  if [[ -n "$build" ]]; then kill "$build" 2>/dev/null || true; fi
  if [[ -n "$started" ]]; then "$VENV/bin/python" tools/kafka_local.py stop --instance "$INSTANCE"; fi
  # The three-broker cluster of the `cluster` tests: pytest stops it, unless pytest was killed.
  if [[ -f .kafka/pytest-cluster/cluster.json ]]; then
    "$VENV/bin/python" tools/kafka_cluster.py stop --instance pytest-cluster
  fi
}
trap cleanup EXIT INT TERM

if [[ -n "${SETUP_CMD:-}" ]]; then
  # The compiled build is one C compiler process; the checks below take the other core. Its
  # own mypy cache: two mypy runs with different options would keep invalidating one cache.
  echo "== setup (in the background, output in $VENV/setup.log): $SETUP_CMD"
  MYPY_CACHE_DIR=build/mypy-cache-setup $SETUP_CMD >"$VENV/setup.log" 2>&1 &
  build=$!
fi
echo "== ruff"; "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check .
echo "== mypy --strict"; "$VENV/bin/mypy"
# The chart and alert rules by the real tools (helm, kubernetes-validate, promtool); this also
# installs them into the cache outside the clone the first time, for the tests that use them.
echo "== test-deploy"; "$VENV/bin/python" -m tools.deploy_check
if [[ -n "$build" ]]; then
  status=0
  wait "$build" || status=$?
  build=""
  tail -n 3 "$VENV/setup.log"
  if [[ $status -ne 0 ]]; then
    echo "== setup failed (exit $status); its output:" >&2
    cat "$VENV/setup.log" >&2
    exit "$status"
  fi
fi

start_broker() {
  if ! "$VENV/bin/python" tools/kafka_local.py status --instance "$INSTANCE" >/dev/null 2>&1; then
    started=yes
    "$VENV/bin/python" tools/kafka_local.py start --instance "$INSTANCE" --fresh
  fi
  export RECONCILER_TEST_BOOTSTRAP
  RECONCILER_TEST_BOOTSTRAP=$("$VENV/bin/python" tools/kafka_local.py bootstrap --instance "$INSTANCE")
  export RECONCILER_TEST_INSTANCE=$INSTANCE
}

if [[ $# -gt 0 ]]; then
  start_broker
  echo "== pytest $* (broker $RECONCILER_TEST_BOOTSTRAP)"
  "$VENV/bin/pytest" "$@"
  exit
fi
echo "== pytest: the tests that need no broker, two workers"
unit=0
"$VENV/bin/pytest" -m "not kafka" -n 2 --durations=10 || unit=$?
start_broker
echo "== pytest: the Kafka tests (broker $RECONCILER_TEST_BOOTSTRAP)"
kafka=0
"$VENV/bin/pytest" -m kafka --durations=10 || kafka=$?
echo "== pytest exit codes: no broker $unit, Kafka $kafka"
exit $(( unit != 0 ? unit : kafka ))
