"""The chat's input checks: --model resolution, the questions file, and flows.chat's one-line errors
(exit code 2) for bad input, all before any server starts."""

from __future__ import annotations

import json
import socket

import pytest

import flows.chat as chat
from components.chat import read_questions, resolve_model
from components.marker import MARKER_FILE, MARKER_FORMAT


def _checkpoint(path, *, config=True, tokenizer=True, template=True):
    path.mkdir(parents=True)
    if config:
        (path / "config.json").write_text("{}")
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    if template:
        (path / "chat_template.jinja").write_text("{{ messages }}")
    return path


# ----------------------------------------------------------------------------- resolve_model


def test_run_names_resolve_under_models(tmp_path):
    rl = _checkpoint(tmp_path / "models" / "grpo-s0" / "final")
    sft = _checkpoint(tmp_path / "models" / "sft")
    assert resolve_model("grpo-s0", tmp_path / "models") == rl.resolve()
    assert resolve_model("sft", tmp_path / "models") == sft.resolve()
    assert resolve_model(str(rl), tmp_path / "elsewhere") == rl.resolve()


def test_unknown_model_lists_the_runs(tmp_path):
    _checkpoint(tmp_path / "models" / "grpo-s0" / "final")
    with pytest.raises(
        ValueError, match=r"'nope' is neither a directory nor a run name \(runs under .*: grpo-s0\)"
    ):
        resolve_model("nope", tmp_path / "models")


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ({"config": False}, "is not an HF checkpoint: no config.json"),
        ({"tokenizer": False}, "is not an HF checkpoint: no tokenizer.json or tokenizer_config.json"),
        ({"template": False}, "has no chat template"),
    ],
)
def test_a_directory_that_is_not_a_chat_checkpoint(tmp_path, missing, message):
    path = _checkpoint(tmp_path / "m", **missing)
    with pytest.raises(ValueError, match=message):
        resolve_model(str(path), tmp_path)


def test_a_chat_template_inside_tokenizer_config_counts(tmp_path):
    path = _checkpoint(tmp_path / "m", tokenizer=False, template=False)
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert resolve_model(str(path), tmp_path) == path.resolve()


def test_an_incomplete_steprl_checkpoint(tmp_path):
    path = _checkpoint(tmp_path / "m")
    marker = {"format": MARKER_FORMAT, "files": {"model.safetensors": 10}, "metadata": {}}
    (path / MARKER_FILE).write_text(json.dumps(marker))
    with pytest.raises(ValueError, match="incomplete checkpoint: file model.safetensors .* is missing"):
        resolve_model(str(path), tmp_path)


# ----------------------------------------------------------------------------- read_questions


def _jsonl(tmp_path, *lines: str):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_questions_are_read_with_ids_and_answers(tmp_path):
    path = _jsonl(
        tmp_path, '{"question": " What is 2 + 2? ", "answer": 4}', "", '{"question": "b", "id": "x"}'
    )
    assert read_questions(path) == [
        {"id": "1", "question": "What is 2 + 2?", "answer": "4"},
        {"id": "x", "question": "b", "answer": None},
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "a"', "line 2: not valid JSON"),
        ('["a"]', "line 2: expected a JSON object"),
        ('{"query": "a"}', r"line 2: unknown key\(s\) \['query'\]"),
        ('{"question": ""}', "line 2: 'question' must be a non-empty string"),
        ('{"question": 3}', "line 2: 'question' must be a non-empty string"),
        ('{"question": "a", "answer": [1]}', "line 2: 'answer' must be a string or a number"),
    ],
)
def test_a_bad_line_is_named(tmp_path, line, message):
    path = _jsonl(tmp_path, '{"question": "fine"}', line)
    with pytest.raises(ValueError, match=f"q.jsonl {message}"):
        read_questions(path)


def test_empty_missing_and_duplicate_question_files(tmp_path):
    with pytest.raises(ValueError, match="no questions in it"):
        read_questions(_jsonl(tmp_path, "", " "))
    with pytest.raises(ValueError, match="no such file"):
        read_questions(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match=r"duplicate id\(s\) \['a'\]"):
        read_questions(_jsonl(tmp_path, '{"question": "x", "id": "a"}', '{"question": "y", "id": "a"}'))


# ----------------------------------------------------------------------------- flows.chat errors


def _error(capsys, *argv: str) -> str:
    assert chat.main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_unknown_task_lists_the_known_tasks(capsys):
    line = _error(capsys, "--server", "http://127.0.0.1:9", "--task", "chess")
    assert "unknown task 'chess'; known tasks:" in line and "calc" in line and "search" in line


def test_a_task_without_tools_is_refused(capsys):
    assert "task 'sokoban' has no tools" in _error(
        capsys, "--server", "http://127.0.0.1:9", "--task", "sokoban"
    )


def test_a_task_without_its_prepared_data(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "processed", lambda task: tmp_path / task)
    line = _error(capsys, "--server", "http://127.0.0.1:9", "--task", "search")
    assert "task 'search' cannot build its environment" in line and "no search index" in line


def test_model_that_is_not_a_checkpoint(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    assert "is not an HF checkpoint: no config.json" in _error(capsys, "--model", str(tmp_path / "m"))


def test_a_server_that_does_not_answer_is_named(capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = _error(capsys, "--server", f"http://127.0.0.1:{port}")
    assert f"the server at http://127.0.0.1:{port} does not answer" in line


def test_port_in_use(capsys, tmp_path):
    model = _checkpoint(tmp_path / "m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = _error(capsys, "--model", str(model), "--port", str(port))
    assert f"port {port} on 127.0.0.1 is in use" in line


def test_bad_questions_file_fails_before_any_server(capsys, tmp_path):
    q = _jsonl(tmp_path, '{"question": "ok"}', "{oops")
    line = _error(
        capsys, "--server", "http://127.0.0.1:9", "--questions", str(q), "--out", str(tmp_path / "t.jsonl")
    )
    assert "q.jsonl line 2: not valid JSON" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give --model"),
        (("--model", "x", "--server", "http://127.0.0.1:9"), "not both"),
        (("--server", "http://127.0.0.1:9", "--questions", "q.jsonl"), "needs both --questions and --out"),
        (("--server", "http://127.0.0.1:9", "--max-turns", "0"), "--max-turns must be positive"),
        (("--model", "x", "--port", "70000"), "--port must be in 1..65535"),
    ],
)
def test_argument_combinations(capsys, argv, message):
    assert message in _error(capsys, *argv)
