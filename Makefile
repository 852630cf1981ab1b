# The two commands of the README: `make build` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JOBS ?= 2

.PHONY: build test test-py310 test-gpu bench clean

# pyproject claims Python >= 3.10: `make test` also runs the spec and CLI tests on 3.10 (tomli for
# tomllib, the loader, run's .npz handling, their fuzz, spec generation, the tokenizer with 3.10's
# regex wheel) in a second venv, when a python3.10 is at hand.
PYTHON310 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10) \
                         $(shell python3.10 -c '' 2>/dev/null && command -v python3.10))
VENV310 := .venv310

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,ptxas,sass]'
	touch $(STAMP)

build: $(STAMP)
	$(BIN)/ptxgen build specs/qwen3.toml -o build/qwen3 --jobs $(JOBS)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q
	$(MAKE) --no-print-directory test-py310

$(VENV310)/.installed: pyproject.toml
	$(PYTHON310) -m venv $(VENV310)
	$(VENV310)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

test-py310:
ifeq ($(PYTHON310),)
	@echo "test-py310: no python3.10 on this machine; skipped"
else
	$(MAKE) --no-print-directory $(VENV310)/.installed
	$(VENV310)/bin/python -m pytest -n $(JOBS) -q -p no:cacheprovider tests/test_spec.py tests/test_run_cli.py tests/test_fuzz.py tests/test_specgen.py tests/test_tokenizer.py
endif

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu -q

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf build $(VENV) $(VENV310)
