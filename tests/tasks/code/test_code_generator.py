"""The code task's generators are reasoning-gym's: seeded, disjoint splits of reasoning-gym's own items,
its score_answer counted at full score only, a params mix that chooses the generators, and every
expert program printing its answer through the real sandbox."""

from __future__ import annotations

import json

import pytest
import reasoning_gym
from pydantic import ValidationError

from components.envs.registry import get_task
from components.schemas import TaskSchema
from components.tasks.code.generator import (
    CONFIGS,
    GENERATORS,
    dataset_seed,
    expert_conversation,
    generate_splits,
    problem,
    score_answer,
    weak_conversation,
)

SIZES = dict(n_train=120, n_val=20, n_test=30)


def _splits(seed=0, **kw):
    return get_task("code").prepare(kw or {}, seed=seed, **SIZES)


def test_seeded_and_disjoint():
    a, b, c = _splits(0), _splits(0), _splits(1)
    assert all(a[s].equals(b[s]) for s in a)
    assert not a["train"].equals(c["train"])
    questions = [set(a[s]["question"]) for s in ("train", "val", "test")]
    assert sum(map(len, questions)) == len(set().union(*questions)) == sum(SIZES.values())
    for split, df in a.items():
        TaskSchema.validate(df)
        assert set(df["split"]) == {split}
    # reasoning-gym seeds item i with seed + i; hashed, seed 1 is not seed 0 moved by a few items
    for name in GENERATORS:
        assert abs(dataset_seed(1, name) - dataset_seed(0, name)) > 10**6, name
    assert problem("word_sorting", 0, seed=1, max_number=60) != problem(
        "word_sorting", 1, seed=0, max_number=60
    )


def test_problems_are_reasoning_gyms_own_items():
    """Each row is the item reasoning_gym.create_dataset gives for its generator, seed and index, with
    the task's config for max_number: the same question, answer and metadata."""
    splits = _splits(0)
    rows = [r for df in splits.values() for r in df.iter_rows(named=True)]
    assert {r["generator"] for r in rows} == set(GENERATORS)
    for name in GENERATORS:
        row = next(r for r in rows if r["generator"] == name)
        index = json.loads(row["metadata"])["source_index"]
        data = reasoning_gym.create_dataset(
            name, seed=dataset_seed(0, name), size=index + 1, **CONFIGS[name](60)
        )
        item = data[index]
        assert (row["question"], row["answer"]) == (item["question"], item["answer"]), name
        assert json.loads(row["metadata"]) == json.loads(json.dumps(item["metadata"], default=str))


def test_the_configs_keep_the_sizes_of_max_number():
    """Operands and converted or factorised numbers stay within the task's sizes of max_number."""
    for i in range(40):
        assert max(problem("gcd", i, seed=0, max_number=60).metadata["numbers"]) <= 60
        assert max(problem("lcm", i, seed=0, max_number=60).metadata["numbers"]) <= 30
        assert problem("prime_factorization", i, seed=0, max_number=60).metadata["number"] <= 240
        assert problem("base_conversion", i, seed=0, max_number=60).metadata["decimal_value"] <= 240
        assert problem("count_primes", i, seed=0, max_number=60).metadata["end"] <= 120
        assert len(problem("word_sorting", i, seed=0, max_number=60).metadata["transformed_words"]) <= 5
        expr = problem("basic_arithmetic", i, seed=0, max_number=60).metadata["expression"]
        assert "/" not in expr and all(abs(int(t)) < 100 for t in expr.split() if t.lstrip("-").isdigit())
    assert max(problem("gcd", i, seed=0, max_number=1000).metadata["numbers"][0] for i in range(40)) > 60


def test_the_mix_chooses_the_generators():
    df = _splits(mix={"gcd": 1.0, "word_sorting": 0.0, "lcm": 2.0})["train"]
    assert set(df["generator"]) == {"gcd", "lcm"}


@pytest.mark.parametrize("mix", [{"fizzbuzz": 1.0}, {"gcd": 0.0}, {"gcd": -1.0}])
def test_a_bad_mix_is_refused_naming_it(mix):
    with pytest.raises(ValidationError, match="mix"):
        get_task("code").params({"mix": mix})


def test_weak_demonstrations_only_in_train():
    splits = get_task("code").prepare({"weak_per_question": 1.0}, seed=0, **SIZES)
    recipe = get_task("code")
    assert all(len(recipe.demonstrations(r)) == 2 for r in splits["train"].iter_rows(named=True))
    assert all(len(recipe.demonstrations(r)) == 1 for r in splits["test"].iter_rows(named=True))


@pytest.mark.parametrize("name", GENERATORS)
def test_score_answer_is_reasoning_gyms_at_full_score(name):
    """The answer scores 1 by reasoning-gym's score_answer and here; a near miss scores 0 here, also
    where reasoning-gym gives it partial credit."""
    p = problem(name, 3, seed=0, max_number=60)
    entry = {"question": p.question, "answer": p.answer, "metadata": p.metadata}
    scorer = reasoning_gym.create_dataset(name, seed=0, size=1, **CONFIGS[name](60))
    assert scorer.score_answer(p.answer, entry) == 1.0
    assert score_answer(name, p.answer, entry) == 1.0
    assert score_answer(name, f"  {p.answer} ", entry) == 1.0
    assert score_answer(name, None, entry) == 0.0
    assert score_answer(name, p.answer + "1", entry) == 0.0


def test_partial_credit_is_zero():
    """reasoning-gym's partial scores (factors in the wrong form, words in the other order) count 0."""
    p = problem("word_sorting", 0, seed=0, max_number=60)
    entry = {"question": p.question, "answer": p.answer, "metadata": p.metadata}
    backwards = ", ".join(reversed(p.answer.split(", ")))
    scorer = reasoning_gym.create_dataset("word_sorting", seed=0, size=1)
    assert 0 < scorer.score_answer(backwards, entry) < 1
    assert score_answer("word_sorting", backwards, entry) == 0.0
    with pytest.raises(ValueError, match="unknown generator 'fizzbuzz'"):
        score_answer("fizzbuzz", "1", entry)


def test_generated_sizes_fail_clearly():
    with pytest.raises(ValueError, match="max_number"):
        generate_splits(
            seed=0, n_train=2000, n_val=0, n_test=0, mix={"gcd": 1.0}, max_number=10, weak_per_question=0
        )


def test_every_mix_entry_is_solved_by_its_demonstration(sandbox):
    """For every generator of the mix: the expert's program prints the answer and reasoning-gym's
    score_answer accepts it; the weaker first attempt fails with the error line the demonstration
    shows, all through the real tool."""
    from components.tasks.code.tool import PythonTool

    tool = PythonTool(sandbox)
    defaults = dict(get_task("code").params({}).mix)
    assert set(defaults) == set(GENERATORS)
    for name in GENERATORS:
        for index in range(3):
            p = problem(name, index, seed=5, max_number=60)
            entry = {"question": p.question, "answer": p.answer, "metadata": p.metadata}
            for convo in (expert_conversation(p), weak_conversation(p)):
                for call, reply in zip(convo[0::2], convo[1::2]):
                    if call.get("tool_calls"):
                        code = call["tool_calls"][0]["function"]["arguments"]["code"]
                        assert tool.execute({"code": code}).text == reply["content"], (name, code)
            printed = tool.execute({"code": p.code}).text
            assert score_answer(name, printed, entry) == 1.0, (name, p.code, printed)


def test_every_split_has_the_same_share_of_each_generator():
    """At the params' default sizes each split has each generator's share within chance (4 standard
    errors of a test split's share): the problems are shuffled before the splits are cut. Drawn in
    order, a generator with few distinct questions (lcm, prime_factorization) ran out early and the
    test split got almost none of them."""
    import math
    from pathlib import Path

    import yaml

    from components.config import load_params

    path = Path(__file__).resolve().parents[3] / "params.yaml"
    params = load_params(path, overrides=yaml.safe_load(path.read_text())["profiles"]["code"])
    code = params.tasks["code"]
    sizes = dict(n_train=params.prepare.n_train, n_val=params.prepare.n_val, n_test=params.prepare.n_test)
    splits = get_task("code").prepare(code, seed=params.seed, **sizes)
    shares = {s: df["generator"].value_counts(normalize=True) for s, df in splits.items() if s != "val"}
    train = dict(shares["train"].iter_rows())
    test = dict(shares["test"].iter_rows())
    assert set(train) == set(test) == {k for k, w in code.mix.items() if w > 0}
    n_test = sizes["n_test"]
    for name in train:
        share = (train[name] * sizes["n_train"] + test[name] * n_test) / (sizes["n_train"] + n_test)
        assert abs(train[name] - test[name]) < 4 * math.sqrt(share * (1 - share) / n_test), (
            name,
            train,
            test,
        )


def test_the_task_imports_reasoning_gym_only_to_make_or_score_problems():
    """reasoning-gym imports all its generators (seconds); loading params imports every task's params
    model, so the code task's modules must not import it. Checked in a fresh interpreter."""
    import subprocess
    import sys

    code = "import sys, components.tasks.code; print('reasoning_gym' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
