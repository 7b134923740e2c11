"""A safe arithmetic calculator: the ``calculator`` tool of the calc task.

The expression is parsed with :mod:`ast` and walked over a whitelist: numbers, ``+ - * / // % **``,
unary ``+``/``-`` and parentheses. Nothing is ever ``eval``-ed. Arithmetic is exact (``Fraction``), so
``0.1 + 0.2`` is ``0.3`` and ``7 / 2`` is ``3.5``. Every bound is checked *before* the work is done:
expression length, magnitude of every number and intermediate result, exponent size, and the size of
a power's result, so no input can run long or allocate much. Each failure is one clear error line.

It does not support names, functions, variables, comparisons, bit operations or complex numbers.

Departures from ordinary Python arithmetic:
1. Results are exact fractions; a fractional exponent (``16 ** 0.5``) is computed in float and the
   result treated as exact from there.
2. A value whose denominator exceeds ``10**12`` is rounded to the nearest fraction with a smaller one
   (so values below about ``1e-12`` become 0).
3. Output is canonical: integers without ``.0``; other values rounded to 6 decimals, trailing zeros cut.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from components.envs.base import BaseTool, ToolResult
from components.envs.registry import register_tool

__all__ = ["CalcError", "CalculatorTool", "calculate", "evaluate", "format_number"]

MAX_EXPRESSION_CHARS = 200
MAX_ABS = 10**15  # largest magnitude of any number or intermediate result
MAX_EXPONENT = 100
_MAX_POW_BITS = 4096  # a power whose exact numerator/denominator would need more bits is refused
_MAX_DENOMINATOR = 10**12
_ALLOWED = "use only numbers, + - * / // % ** and parentheses"


class CalcError(ValueError):
    """An expression the calculator refuses; the message is feedback for the model."""


_BINOPS: dict[type, tuple[str, Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", lambda a, b: Fraction(a // b)),
    ast.Mod: ("%", operator.mod),
}
_REFUSED_OPS = {
    ast.BitXor: "^ (use ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
}


def format_number(value: Fraction | int | float) -> str:
    """Canonical text of a number: ``60``, ``3.5``, ``0.333333`` (6 decimals, trailing zeros cut)."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _checked(value: Fraction) -> Fraction:
    if abs(value) > MAX_ABS:
        raise CalcError(f"number too large: results must stay within +-{MAX_ABS:.0e}")
    if value.denominator > _MAX_DENOMINATOR:
        value = value.limit_denominator(_MAX_DENOMINATOR)
    return value


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if abs(exp) > MAX_EXPONENT:
        raise CalcError(f"exponent too large: |{format_number(exp)}| > {MAX_EXPONENT}")
    if exp.denominator == 1:
        e = exp.numerator
        if base == 0 and e < 0:
            raise CalcError("division by zero (0 raised to a negative power)")
        bits = max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(e)
        if bits > _MAX_POW_BITS:
            raise CalcError(f"number too large: results must stay within +-{MAX_ABS:.0e}")
        return base**e
    if base < 0:
        raise CalcError("a negative number cannot be raised to a fractional power")
    if base == 0:
        if exp < 0:
            raise CalcError("division by zero (0 raised to a negative power)")
        return Fraction(0)
    log10 = float(exp) * math.log10(base)  # log10 of a Fraction is exact enough to bound the result
    if log10 > 16:
        raise CalcError(f"number too large: results must stay within +-{MAX_ABS:.0e}")
    return Fraction(float(base) ** float(exp))


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = {str: "text", bytes: "bytes", complex: "a complex number"}.get(type(value), repr(value))
            raise CalcError(f"only numbers are allowed, got {kind}; {_ALLOWED}")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise CalcError(f"number too large: results must stay within +-{MAX_ABS:.0e}")
            return _checked(Fraction(repr(value)))
        return _checked(Fraction(value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        inner = _walk(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp):
        if type(node.op) in _REFUSED_OPS:
            raise CalcError(f"operator {_REFUSED_OPS[type(node.op)]} is not allowed; {_ALLOWED}")
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if type(node.op) not in _BINOPS:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed; {_ALLOWED}")
        symbol, fn = _BINOPS[type(node.op)]
        if right == 0 and symbol in ("/", "//", "%"):
            raise CalcError("division by zero")
        return _checked(fn(left, right))
    if isinstance(node, ast.Tuple):
        raise CalcError("commas are not allowed (write 1000, not 1,000)")
    if isinstance(node, ast.Name):
        raise CalcError(f"name {node.id[:40]!r} is not allowed; {_ALLOWED}")
    if isinstance(node, ast.Call):
        raise CalcError(f"function calls are not allowed; {_ALLOWED}")
    raise CalcError(f"{type(node).__name__} is not allowed; {_ALLOWED}")


def evaluate(expression: Any) -> Fraction:
    """The exact value of an arithmetic expression; raises :class:`CalcError` with a clear reason."""
    if not isinstance(expression, str):
        raise CalcError(f"the expression must be a string, got {type(expression).__name__}")
    expression = expression.strip()
    if not expression:
        raise CalcError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression too long ({len(expression)} chars > {MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, UnicodeError, RecursionError, MemoryError):
        raise CalcError(f"syntax error in {expression[:60]!r}; {_ALLOWED}") from None
    try:
        return _walk(tree)
    except RecursionError:
        raise CalcError("expression is nested too deeply") from None
    except (OverflowError, ZeroDivisionError) as err:
        raise CalcError(f"arithmetic error: {err}") from None


def calculate(expression: Any) -> ToolResult:
    """Evaluate and format; failures become an error result (``error: <reason>``)."""
    try:
        return ToolResult(format_number(evaluate(expression)))
    except CalcError as err:
        return ToolResult(f"error: {err}", is_error=True)


@register_tool("calculator")
class CalculatorTool(BaseTool):
    name = "calculator"
    description = "Evaluate an arithmetic expression with numbers, + - * / // % ** and parentheses."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "for example: 5 * 12"}},
        "required": ["expression"],
        "additionalProperties": False,
    }

    def execute(self, args: dict[str, Any]) -> ToolResult:
        return calculate(args.get("expression"))
