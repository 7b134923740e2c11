"""flows._stage.ensure_experiment: every stage finds (or creates) its MLflow experiment, also when
another process creates it at the same moment."""

from __future__ import annotations

import pytest

import mlflow
from flows._stage import ensure_experiment


@pytest.fixture
def store(tmp_path):
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield tmp_path
    mlflow.set_tracking_uri(previous)


def test_creates_the_experiment_once_with_its_artifact_location(store):
    location = (store / "artifacts").as_uri()
    first = ensure_experiment("calc", location)
    assert ensure_experiment("calc", location) == first
    assert mlflow.get_experiment(first).artifact_location == location
    assert first != "0"


def test_the_loser_of_a_creation_race_gets_the_winners_experiment(store, monkeypatch):
    winner = mlflow.create_experiment("calc")  # created by "another process" ...
    real = mlflow.get_experiment_by_name
    calls = []

    def not_yet_there(name):  # ... just after this process looked for it
        calls.append(name)
        return None if len(calls) == 1 else real(name)

    monkeypatch.setattr(mlflow, "get_experiment_by_name", not_yet_there)
    assert ensure_experiment("calc") == winner
    assert len(calls) == 2  # looked, lost the create, looked again


def test_other_store_errors_are_not_swallowed(store, monkeypatch):
    def broken(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("disk full", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(mlflow, "create_experiment", broken)
    with pytest.raises(mlflow.exceptions.MlflowException, match="disk full"):
        ensure_experiment("calc")
