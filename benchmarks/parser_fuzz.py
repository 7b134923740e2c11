"""Random hostile model output through every tool-call parser: crashes, hangs, oversized feedback.

    python benchmarks/parser_fuzz.py [--cases 100000] [--seed 0] [--parsers hermes,mistral] [--start 0]

Each case joins 1-6 random fragments: every format's call markup (whole, cut at a random point, with
its JSON or XML body broken), valid calls of known and unknown tools, wrong argument types, deep
brackets, huge strings, lone surrogates, control and bidi characters, NUL bytes, numbers longer than
Python's digit limit, and random bytes decoded as text. Each case goes through the parser's
``parse(text, tools, max_chars=4096, max_calls=8)``, as ``ToolEnv.step`` calls it. Prints per parser:
cases, crashes (the parser raised; must be 0), results that break the contract (feedback longer than
``_MAX_FEEDBACK`` characters, more than max_calls + 1 entries, a final answer that holds calls: must be
0), the count of finals / valid calls / errors, the slowest case in ms, and the wall time.
``--start K`` runs cases K .. K + cases - 1 of the seed's sequence (the texts do not depend on how the
run is split), so several processes can share one run: their counts add up.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.envs.parsing import CallError, ToolCall
from components.envs.tool_formats import TOOL_PARSERS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "arithmetic",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
]
MAX_CHARS, MAX_CALLS = 4096, 8
_MAX_FEEDBACK = 1000  # a CallError message longer than this breaks the contract

_MARKERS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<function=calculator>",
    "<parameter=expression>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    "\n",
    "<answer>",
    "</answer>",
]
_JUNK = [
    "\x00",
    "\ud800",
    "\udfff",
    "\u202e",
    "\ufeff",
    "💥",
    "\r\n",
    "\t",
    "NaN",
    "Infinity",
    "-0",
    "9" * 5000,
    "null",
    "true",
    "__import__('os')",
    "'",
    "&lt;",
    "<!--",
    "]]>",
]


def _valid_args(rng: random.Random) -> tuple[str, dict]:
    choice = rng.randrange(5)
    if choice == 0:
        return "calculator", {"expression": rng.choice(["1+2", "5 * 12", "", "\ud800", "x" * 3000])}
    if choice == 1:
        return "search", {"query": rng.choice(["Ava Lin", "42", "a\nb"]), "k": rng.choice([1, -3, 10**30])}
    if choice == 2:
        return "calculator", {"expression": rng.choice([5, None, [1], {"a": 1}, 1.5])}  # wrong types
    if choice == 3:
        return rng.choice(["nope", "", "💥", "calculator\n", "a" * 300]), {}
    return "search", {}  # missing required


def _fragment(rng: random.Random, formats: list) -> str:
    kind = rng.randrange(10)
    if kind <= 3:  # a call in some format, maybe cut or broken
        fmt = rng.choice(formats)
        name, args = _valid_args(rng)
        try:
            text = fmt.format_call(name, args)
        except (TypeError, ValueError):
            text = fmt.format_call("calculator", {"expression": "1"})
        mode = rng.randrange(4)
        if mode == 1:
            text = text[: rng.randrange(len(text) + 1)]
        elif mode == 2 and text:
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(_MARKERS + _JUNK) + text[i + 1 :]
        return text
    if kind == 4:
        return rng.choice(_MARKERS) * rng.choice([1, 2, 50, 2000])
    if kind == 5:
        depth = rng.choice([10, 1000, 20_000])
        return rng.choice(["[", "{", '{"a":']) * depth + rng.choice(["", "]" * depth, "}" * depth])
    if kind == 6:
        return "".join(rng.choice(_JUNK) for _ in range(rng.randrange(1, 8)))
    if kind == 7:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).decode("latin-1")
    if kind == 8:
        return json.dumps(
            {"name": rng.choice(["calculator", "search", 3]), "arguments": rng.choice([{}, "{", [], 1])}
        )
    return rng.choice(["<answer>97</answer>", "The answer is 4.", "", " ", "x" * rng.choice([10, 10_000])])


def hostile_texts(seed: int, n: int) -> list[str]:
    """``n`` hostile texts, the same for a seed."""
    rng = random.Random(seed)
    formats = TOOL_PARSERS.values()
    return ["".join(_fragment(rng, formats) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def broken_contract(parsed) -> str | None:
    """Why a parse result breaks the parser contract, None when it keeps it."""
    if parsed.is_final and parsed.calls:
        return "a final answer with calls"
    if not parsed.is_final and not parsed.calls:
        return "not final but no calls"
    if len(parsed.calls) > MAX_CALLS + 1:
        return f"{len(parsed.calls)} entries"
    for c in parsed.calls:
        if isinstance(c, CallError):
            if not isinstance(c.message, str) or len(c.message) > _MAX_FEEDBACK:
                return f"feedback of {len(c.message)} chars"
        elif not isinstance(c, ToolCall) or not isinstance(c.arguments, dict):
            return f"a call of type {type(c).__name__}"
    if len(parsed.text) > MAX_CHARS:
        return "text longer than max_chars"
    return None


def fuzz(name: str, texts: list[str]) -> dict:
    """Every text through parser ``name``: the figures the module docstring lists."""
    fmt = TOOL_PARSERS.get(name)
    fmt.prepare()  # imports vLLM for its parsers (seconds), not counted in a case
    parse = fmt.parse
    out = {"parser": name, "cases": 0, "crashes": 0, "broken": 0, "final": 0, "valid": 0, "errors": 0}
    slowest, examples = 0.0, []
    start = time.perf_counter()
    for text in texts:
        t0 = time.perf_counter()
        try:
            parsed = parse(text, TOOLS, max_chars=MAX_CHARS, max_calls=MAX_CALLS)
        except Exception as err:  # counted: a crash
            out["crashes"] += 1
            examples.append(f"{type(err).__name__}: {err!s:.120} on {text[:80]!r}")
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - t0)
            out["cases"] += 1
        why = broken_contract(parsed)
        if why is not None:
            out["broken"] += 1
            examples.append(f"{why} on {text[:80]!r}")
        out["final"] += parsed.is_final
        out["valid"] += len(parsed.valid_calls)
        out["errors"] += len(parsed.errors)
    out["slowest_ms"] = round(slowest * 1000, 1)
    out["wall_s"] = round(time.perf_counter() - start, 1)
    out["examples"] = examples[:5]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parsers", default=",".join(TOOL_PARSERS), help="comma-separated names")
    ap.add_argument("--start", type=int, default=0, help="the first case of the seed's sequence to run")
    args = ap.parse_args()
    texts = hostile_texts(args.seed, args.start + args.cases)[args.start :]
    bad = 0
    for name in args.parsers.split(","):
        r = fuzz(name, texts)
        bad += r["crashes"] + r["broken"]
        print(json.dumps(r, ensure_ascii=True), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
