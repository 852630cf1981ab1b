# The two commands of the README: `make build` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JOBS ?= 2

.PHONY: build test test-gpu bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

build: $(STAMP)
	$(BIN)/ptxgen build specs/qwen3.toml -o build/qwen3 --jobs $(JOBS)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu -q

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf build $(VENV)
