#!/usr/bin/env sh
# The MLflow tracking server of steprl, on the store the pipeline already writes without a server:
#   backend store   sqlite:///<repo>/mlflow/mlflow.db   (runs logged before the server started show up)
#   artifacts       <repo>/mlflow/artifacts             (file:// root of the experiments steprl creates)
# Artifacts are also served (--serve-artifacts: clients upload/download them over HTTP). With
# STEPRL_MLFLOW_SERVE_ARTIFACTS=1 (make serve POOL=...) the experiments created through the server get
# the root mlflow-artifacts:/ instead, i.e. the same directory reached only through the server: what
# workers without a shared disk need (docs/scale-out.md; mlflow/README.md).
# Bound to 127.0.0.1 unless STEPRL_MLFLOW_HOST says otherwise; port STEPRL_MLFLOW_PORT (default 5000).
# `make serve` (python -m flows.serve start) runs this next to the Prefect server; run it alone with
#   .venv/bin/activate && mlflow/server.sh        Extra arguments go to `mlflow server`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$here/artifacts"
root="file://$here/artifacts"
if [ -n "${STEPRL_MLFLOW_SERVE_ARTIFACTS:-}" ]; then root="mlflow-artifacts:/"; fi
# One worker: one process owns the sqlite file, so concurrent clients queue at the server instead of
# contending for the file lock. Job execution (GenAI scorer jobs, 7 extra processes) is not used by steprl.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec mlflow server \
  --backend-store-uri "sqlite:///$here/mlflow.db" \
  --default-artifact-root "$root" \
  --serve-artifacts --artifacts-destination "$here/artifacts" \
  --host "${STEPRL_MLFLOW_HOST:-127.0.0.1}" \
  --port "${STEPRL_MLFLOW_PORT:-5000}" \
  --workers 1 \
  "$@"
