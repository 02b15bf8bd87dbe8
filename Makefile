# The two Quick start commands (README.md): `make demo` and `make test`.
# Both build .venv from scratch with the Python 3.11 on PATH; nothing else is installed by hand.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test bench chaos fuzz clean

$(BIN)/.installed: setup.cfg pyproject.toml
	@echo "==> creating $(VENV) and installing federator with its test dependencies (about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[test]'
	@touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/federator demo

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m pytest tests/bench -s

# the kill test's long run (9 kills over 2,000 keys; the default test run makes 2 kills)
chaos: install
	FEDERATOR_CHAOS_KILLS=9 $(BIN)/python -m pytest tests/integration/test_chaos.py -s

# the SQL fuzzer's long run against DuckDB (FEDERATOR_FUZZ_STATEMENTS, default 3,000; FEDERATOR_FUZZ_SEED)
# and the hostile-input suite with its slow cases (50,000-item IN lists)
fuzz: install
	$(BIN)/python -m tests.integration.fuzz_sql; status=$$?; \
	FEDERATOR_HOSTILE_HUGE=1 $(BIN)/python -m pytest tests/integration/test_hostile.py -s && exit $$status

clean:
	rm -rf $(VENV) .federator
