# The two Quick start commands (README.md): `make demo` and `make test`.
# Both build .venv from scratch with the Python 3.11 on PATH; nothing else is installed by hand.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test test-debs kafka kstreams superset-env superset test-kafka docs spark-cluster bench bench-debs chaos broker-faults fuzz clean

# `pip install federator` is the client alone; .venv has every extra (setup.cfg): the node, the Spark
# side, the development broker and SQLAlchemy (`all`), and the tests' clients (`test`).
$(BIN)/.installed: setup.cfg setup.py pyproject.toml
	@echo "==> creating $(VENV) and installing federator with every extra and the test dependencies (about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[all,test]'
	@touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/federator demo

# Debian packages the tests drive as a user would: chromium (the console, headless), openssl
# (self-signed certificates for the TLS tests), postgresql-client (psql) and libpostgresql-jdbc-java
# (pgjdbc) for the Postgres protocol's tests, tmux (the terminal pgcli runs in), and maven (Apache Kafka's jars and the Kafka Streams application,
# from Maven Central). Installed
# with apt-get when missing (CI and the developers' machines run as root; else sudo).
TEST_DEBS := chromium openssl postgresql-client libpostgresql-jdbc-java maven tmux

test-debs:
	@missing=$$(for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> installing Debian packages the tests use: $$missing (apt-get, a few minutes the first time)"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
	  else echo "the tests need Debian's $$missing; run 'apt-get install $$missing' as root, then make test again"; exit 1; fi; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing || \
	  { echo "apt-get could not install $$missing; install them, then make test again"; exit 1; }; fi

# Apache Kafka's broker (org.apache.kafka:kafka_2.13 and its runtime dependencies) for the tests'
# KRaft clusters (tests/apache_kafka.py): fetched with Maven from Maven Central once per machine,
# cached under ~/.cache/federator (and ~/.m2); Java 17 runs it.
kafka: install
	@$(BIN)/python -m tests.apache_kafka

# The tests' Kafka Streams application (tests/integration/kstreams/, a Maven project): built once
# per machine into ~/.cache/federator with kafka-streams from Maven Central; a JDK 17 and Maven run it.
kstreams: install
	@$(BIN)/python -m tests.integration.kstreams_app

# Apache Superset 6.1 in its own environment beside Federator's client (tests/integration/superset_env.py):
# Superset once per machine under ~/.cache/federator (a few minutes), .venv-superset with the client
# from this checkout (seconds).
superset-env: install
	@$(BIN)/python -m tests.integration.superset_env

# The demo in Superset: the demo's broker, jobs and nodes, and Superset with Federator added twice
# (federator:// and postgresql://), datasets and a dashboard; prints the URL and login. Ctrl-C stops all.
superset: superset-env
	@$(BIN)/python -m tests.integration.superset_demo

# The tests as two pytest processes side by side over disjoint sets of modules (tests/run_shards.py,
# tests/shards.py): most of the run waits on brokers, nodes and JVMs. Arguments for pytest go in
# ARGS (make test ARGS='-x -k stream'); `.venv/bin/python -m pytest` runs the tests in one process.
test: install test-debs kafka kstreams superset-env
	$(BIN)/python -m tests.run_shards $(ARGS)

# Every test marked apache_kafka on Apache Kafka alone, the long ones too (the kill test, every
# Spark read, joins, standby token reads); `make test` runs a part of them on it, all on tansu.
test-kafka: install kafka
	FEDERATOR_APACHE_KAFKA=only $(BIN)/python -m pytest -m apache_kafka

# A Spark standalone cluster (master and worker from the installed PySpark) running the word_counts
# job submitted with spark-submit, the repository shipped as --py-files (tests/spark/test_cluster.py)
spark-cluster: install
	FEDERATOR_SPARK_CLUSTER=1 $(BIN)/python -m pytest tests/spark/test_cluster.py

# The documentation site (sources in docs/, mkdocs.yml) into site/, offline; `make test` builds it too.
docs: install
	$(BIN)/mkdocs build --strict

# The benchmarks also run a Faust worker and wrk (tests/bench/test_bench_faust.py). Faust comes from
# setup.cfg's `bench` extra, installed into a venv of its own so that its pins never change .venv;
# the benchmarks' own clients (redis-py) are the `bench-client` extra, installed into .venv.
FAUST_VENV := .venv-faust

$(FAUST_VENV)/.installed: setup.cfg
	@echo "==> creating $(FAUST_VENV) with setup.cfg's bench extra (the Faust worker of the benchmarks)"
	$(PYTHON) -m venv $(FAUST_VENV)
	$(FAUST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FAUST_VENV)/bin/python -m pip install --quiet --progress-bar off $$($(PYTHON) tests/bench/bench_requirements.py)
	@touch $@

# Debian packages the benchmarks drive: wrk (HTTP load), redis-server (the leaderboard's peer) and
# redis-tools (redis-benchmark, its C load generator).
BENCH_DEBS := wrk redis-server redis-tools

bench-debs:
	@missing=$$(for p in $(BENCH_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> installing Debian packages the benchmarks use: $$missing (apt-get)"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
	  else echo "the benchmarks need Debian's $$missing; run 'apt-get install $$missing' as root, then make bench again"; exit 1; fi; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing || \
	  { echo "apt-get could not install $$missing; install them, then make bench again"; exit 1; }; fi

bench: install $(FAUST_VENV)/.installed bench-debs
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[bench-client]'
	$(BIN)/python -m pytest tests/bench -s

# broker faults: three Apache Kafka brokers, the leader of a changelog partition stopped and started
# (SIGTERM, then SIGKILL) while a writer upserts and readers read with its tokens (a few minutes)
broker-faults: install kafka
	FEDERATOR_BROKER_FAULTS=1 $(BIN)/python -m pytest tests/integration/test_broker_faults.py -s

# the kill test's long run (9 kills over 2,000 keys; the default test run makes 2 kills)
chaos: install
	FEDERATOR_CHAOS_KILLS=9 $(BIN)/python -m pytest tests/integration/test_chaos.py -s

# the SQL fuzzer's long run against DuckDB (FEDERATOR_FUZZ_STATEMENTS, default 3,000; FEDERATOR_FUZZ_SEED)
# and the hostile-input suite with its slow cases (50,000-item IN lists)
fuzz: install
	$(BIN)/python -m tests.integration.fuzz_sql; status=$$?; \
	FEDERATOR_HOSTILE_HUGE=1 $(BIN)/python -m pytest tests/integration/test_hostile.py -s && exit $$status

clean:
	rm -rf $(VENV) $(FAUST_VENV) .venv-sqla14 .venv-pgcli .venv-superset .venv-light-* .federator
