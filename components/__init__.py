"""steprl components: the pure library (no Prefect, no MLflow, never reads params.yaml itself)."""
