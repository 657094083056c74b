# Two entry points: `make run` and `make test`. Both set up everything they need.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup clean bench

$(STAMP): pyproject.toml requirements-lock.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements-lock.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/reamer demo

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/sim_speed.py --json bench-sim_speed.json

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
