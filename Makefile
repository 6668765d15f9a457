# Two commands set everything up on a fresh machine:
#   make example   install into .venv, then on bundled data: train a small sentence model and rescore Moses
#                  n-best lists with it, train a small phrase model and annotate a phrase table (examples/run.sh)
#   make test      install into .venv (with the test tools), then lint (ruff, and mypy over the whole package)
#                  and run the test suite (and the torchrun tests)
# Others: make test-slow | test-moses (needs MOSES_HOME) | test-fuzz | bench

PYTHON ?= python3
VENV ?= .venv
# PyTorch as pip's index serves it (on Linux, PyPI serves the CUDA build). For the CPU-only build:
#   make TORCH_INDEX=https://download.pytorch.org/whl/cpu install
# TORCH=torch takes the newest version.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest

.PHONY: install example test lint test-slow test-moses test-fuzz bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,plots]"
	touch $(STAMP)

example: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/run.sh

test: lint
	$(PYTEST)
	$(PYTEST) -m distributed

lint: $(STAMP)
	$(BIN)/ruff check phrase_scorer tests tools
	$(BIN)/mypy --ignore-missing-imports --follow-imports=silent phrase_scorer

test-slow: $(STAMP)
	$(PYTEST) -m slow

test-moses: $(STAMP)
	$(PYTEST) -m moses

test-fuzz: $(STAMP)
	$(PYTEST) -m fuzz

bench: $(STAMP)
	$(BIN)/python tools/bench_annotate.py --write
	$(BIN)/python tools/bench_annotate.py --memory --write
	$(BIN)/python tools/bench_train.py --write

clean:
	rm -rf $(VENV) runs
