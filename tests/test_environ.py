import os

import pytest

from components.environ import patched_environ


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.setenv("STEPRL_T_KEEP", "before")
    monkeypatch.delenv("STEPRL_T_NEW", raising=False)
    monkeypatch.setenv("STEPRL_T_GONE", "present")


def test_sets_removes_and_restores(clean):
    with patched_environ({"STEPRL_T_KEEP": "inside", "STEPRL_T_NEW": "added", "STEPRL_T_GONE": None}):
        assert os.environ["STEPRL_T_KEEP"] == "inside"
        assert os.environ["STEPRL_T_NEW"] == "added"
        assert "STEPRL_T_GONE" not in os.environ
    assert os.environ["STEPRL_T_KEEP"] == "before"
    assert "STEPRL_T_NEW" not in os.environ
    assert os.environ["STEPRL_T_GONE"] == "present"


def test_restores_after_an_exception(clean):
    with pytest.raises(RuntimeError), patched_environ({"STEPRL_T_KEEP": "inside", "STEPRL_T_GONE": None}):
        raise RuntimeError("boom")
    assert os.environ["STEPRL_T_KEEP"] == "before"
    assert os.environ["STEPRL_T_GONE"] == "present"
