# Two commands on a fresh machine: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test test-deploy test-fast lint typecheck broker-start broker-stop demo soak soak-cluster soak-core bench java-runner clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed"' \
		|| { echo "make: Python 3.11+ not found as '$(PYTHON)'. Fix: install it or pass PYTHON=python3.11" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The compiled hot path (tools/build_compiled.py, ~2 min of CPU): mypyc builds the modules listed in
# engine/compiled.py in place; rebuilt when a source or schema changes (RECONCILER_PURE: the
# build reads the sources, old extensions or none). PURE=1 skips it on purpose (the same
# sources run uncompiled, about twice the CPU per event).
# The prerequisites: every module in engine.compiled.COMPILED (read with the system Python, as
# engine/compiled.py needs only the standard library), so a module added there rebuilds when it
# changes, and the modules and schemas the compiled ones take their types and Avro code from.
# The stamp carries the build's start time: a source saved during a build is newer, so the next
# `make setup` builds again (a stamp touched at the end called that stale build current).
COMPILED_SOURCES := $(shell $(PYTHON) -c 'from engine.compiled import COMPILED, ROOT, source_path; \
	print(*(source_path(m).relative_to(ROOT) for m in COMPILED))')
COMPILED := $(VENV)/.compiled
# engine/wire/avro_built.py is the build's own output (generated from the schemas), not an input.
$(COMPILED): $(STAMP) tools/build_compiled.py $(filter-out engine/wire/avro_built.py,$(wildcard $(COMPILED_SOURCES) engine/*.py engine/core/*.py engine/wire/*.py schemas/*.avsc))
	@touch $@.start
	RECONCILER_PURE=1 $(PY) -m tools.build_compiled
	@mv $@.start $@

ifeq ($(PURE),1)
setup: $(STAMP)
	$(PY) -m tools.build_compiled --clean
	@rm -f $(COMPILED)
else
setup: $(STAMP) $(COMPILED)
endif

BOOTSTRAP = $$($(PY) tools/kafka_local.py bootstrap --instance dev)

## run: start the local broker (instance "dev"), create the topics, run the engine in the foreground.
run: setup
	$(PY) tools/kafka_local.py start --instance dev
	$(VENV)/bin/reconciler topics create --bootstrap-servers $(BOOTSTRAP)
	$(VENV)/bin/reconciler run --bootstrap-servers $(BOOTSTRAP)

## demo: scripted runners through lost ack, atomic failure, ambiguity, two copies, repair.
demo: setup
	$(PY) tools/kafka_local.py start --instance dev
	$(VENV)/bin/reconciler demo --embedded-engine --bootstrap-servers $(BOOTSTRAP)

## soak: 100 kill -9s of the engine and 20 broker restarts, each under load, then the
## exactly-once check (a long run, not part of make test). KILLS=, RESTARTS= override. Logs
## stay in .kafka/soak-logs until the next soak.
soak: setup
	RECONCILER_SOAK_KILLS=$${KILLS:-100} RECONCILER_SOAK_RESTARTS=$${RESTARTS:-20} bash tools/test.sh \
		-m kafka tests/integration/test_engine_crash.py \
		"tests/integration/test_engine_resilience.py::test_broker_restart_under_load" -q -s \
		--basetemp=.kafka/soak-logs

## soak-cluster: the three-broker fault tests under load, looped (not part of make test): 20
## kill -9s of the transaction coordinator, 5 rolling restarts, 10 partitions of the engine
## from a broker's clients for 30 s, then the exactly-once check of each. KILLS=, ROLLS=,
## PARTITIONS=, PARTITION_S=, RATE= (inputs/s) override; TEST= (-k) runs one of the three
## (e.g. TEST=rolling), so the soak can be taken in parts. Engine and broker logs stay in
## .kafka/soak-cluster-logs until the next soak (other pytest runs cannot rotate them away).
soak-cluster: setup
	RECONCILER_CLUSTER_KILLS=$${KILLS:-20} RECONCILER_CLUSTER_ROLLS=$${ROLLS:-5} \
	RECONCILER_CLUSTER_PARTITIONS=$${PARTITIONS:-10} RECONCILER_CLUSTER_PARTITION_S=$${PARTITION_S:-30} \
	RECONCILER_CLUSTER_RATE=$${RATE:-1000} RECONCILER_CLUSTER_BACKGROUND_RATE=$${RATE:-1000} \
	bash tools/test.sh -m cluster \
		tests/integration/test_cluster_engine.py -k "$${TEST:-kill_9 or rolling or partitioned}" -q -s \
		--basetemp=.kafka/soak-cluster-logs

## soak-core: the lifecycle properties over 100,000 random examples each (no broker; prints
## Hypothesis's statistics), the v3 one under six merges of the three topics per program. TEST= narrows it (-k).
soak-core: setup
	LIFECYCLE_SOAK=1 LIFECYCLE_EXAMPLES=$${EXAMPLES:-100000} $(VENV)/bin/pytest -q -p no:cacheprovider --timeout=0 \
		--hypothesis-show-statistics tests/unit/core/test_lifecycle.py $${TEST:+-k $$TEST}

## bench: one table from one run (not a test): throughput of the raw EOS pipe, reconciler with 1
## and 2 processes and Quix Streams (same fold), rounds interleaved; latency; restore, RSS and
## failover. Its own broker (instance "bench"), stopped at the end, with its data in RAM
## (kafka_local.py --in-memory: on this machine's shared disk its syncs stalled every system
## for up to a second); BENCH_BROKER= puts it on disk. BENCH_ARGS= passes options
## (e.g. BENCH_ARGS="--sessions 2000 --rounds 1"). Quix lives in .venv-quix: installing it into
## .venv would downgrade pydantic and confluent-kafka.
QUIX_VENV := .venv-quix
$(QUIX_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(QUIX_VENV)/bin/python -m pip install --quiet quixstreams==3.28.1 "msgspec>=0.19"
	$(QUIX_VENV)/bin/python -m pip install --quiet --no-deps -e .
	@touch $@

BENCH_BROKER ?= --in-memory
bench: setup $(QUIX_VENV)/.installed
	$(PY) tools/kafka_local.py start $(BENCH_BROKER) --instance bench
	$(PY) -m tools.bench_engine --quix-python $(QUIX_VENV)/bin/python \
		--bootstrap-servers $$($(PY) tools/kafka_local.py bootstrap --instance bench) $(BENCH_ARGS); \
		code=$$?; $(PY) tools/kafka_local.py stop --instance bench; exit $$code

## java-runner: build the Java example runner (examples/java-runner/) with Maven; the tests do too.
java-runner: setup
	$(PY) -m tools.java_runner build

## test: lint, type-check and the deploy checks beside the compiled build, then the whole suite:
## the tests that need no broker on two workers, then the Kafka ones against a real broker it
## starts (and stops).
test: $(STAMP)
	SETUP_CMD="$(MAKE) --no-print-directory setup PURE=$(PURE)" bash tools/test.sh

## test-deploy: helm lint/template + Kubernetes schema validation of the chart, promtool checks
## and unit tests of the alert rules. Installs Helm, kubernetes-validate (and, as root, Debian's
## prometheus package) once, into ~/.cache/reconciler/tools (tools/deploy_tools.py).
test-deploy: setup
	$(PY) -m tools.deploy_check

## test-fast: the tests that need no broker, less the wheel build (`slow`).
test-fast: setup
	$(VENV)/bin/pytest -m "not kafka and not slow" -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

broker-start: setup
	$(PY) tools/kafka_local.py start --instance dev

broker-stop:
	$(PY) tools/kafka_local.py stop --instance dev

clean: broker-stop
	[ ! -x $(PY) ] || $(PY) -m tools.build_compiled --clean
	rm -rf $(VENV) $(QUIX_VENV) build dist reconciler.egg-info .kafka .registry .mypy_cache .ruff_cache .pytest_cache .hypothesis examples/java-runner/target
