"""The sandbox's ordinary behaviour: what a call returns, the probe, the settings' checks, the tool."""

from __future__ import annotations

import pytest

from components.sandbox import PROTECTIONS, Sandbox, SandboxLimits, SandboxUnavailable
from components.tasks.code.tool import PythonTool


def test_output_and_the_last_traceback_line(run):
    r = run("print('a')\nprint(1 / 0)")
    assert r.status == "error" and r.stdout == "a\n" and r.exit_code == 1
    assert r.last_error_line == "ZeroDivisionError: division by zero"
    assert run("import sys\nsys.exit(3)").exit_code == 3
    assert run("import math\nprint(math.gcd(12, 18))").stdout == "6\n"


def test_this_machine_grants_every_protection(sandbox):
    """The probe found all four here (docs/sandbox.md): the hostile tests rely on them."""
    assert sandbox.probe == dict.fromkeys(PROTECTIONS)


def test_a_missing_protection_refuses_to_start_and_names_it():
    with pytest.raises(SandboxUnavailable, match="seccomp"):
        Sandbox(disable=("seccomp",)).start()


def test_a_weaker_sandbox_starts_when_accepted(weaker):
    assert weaker("landlock").probe["landlock"] == "disabled by the sandbox's settings"


@pytest.mark.parametrize(
    "kwargs", [{"wall_s": 0}, {"cpu_s": 1.5}, {"memory_mb": -1}, {"open_files": 2}, {"threads": True}]
)
def test_bad_limits_are_refused_by_name(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SandboxLimits(**kwargs)


def test_unknown_protection_is_refused():
    with pytest.raises(ValueError, match="nope"):
        Sandbox(disable=("nope",))


def test_the_tool_returns_output_or_the_error_line(sandbox):
    tool = PythonTool(sandbox)
    assert tool.execute({"code": "print(6 * 7)"}).text == "42"
    bad = tool.execute({"code": "print('x')\nint('a')"})
    assert bad.is_error and bad.text == "x\nValueError: invalid literal for int() with base 10: 'a'"
    assert "memory limit 256 MB" in tool.execute({"code": "b = bytearray(1 << 30)"}).text
    assert "print the values" in tool.execute({"code": "x = 1"}).text
    cut = tool.execute({"code": "while True:\n    print('y' * 100)"})
    assert cut.is_error and cut.text.endswith("the program printed more and was stopped]")
