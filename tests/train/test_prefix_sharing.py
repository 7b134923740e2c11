"""Shared-prefix forwards (make_token_batch(share_prefix=True)): same log-probs, entropies and gradients
as one forward per sequence, fewer tokens forwarded, and prefixes chosen per group."""

from __future__ import annotations

import pytest
import torch
from train_helpers import tiny_model

from components.train.policy import critic_values, make_token_batch, response_logprobs, shared_prefix_groups
from components.train.rl_update import step_tensors

SYSTEM = list(range(10, 40))  # 30 tokens every prompt starts with


def _grpo_like(n_groups: int = 3, samples: int = 4, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for k in range(n_groups):
        prompt = SYSTEM + torch.randint(4, 120, (6 + k,), generator=g).tolist()
        for j in range(samples):
            prompts.append(prompt)
            responses.append(torch.randint(4, 120, (3 + 2 * j,), generator=g).tolist())
    prompts.append([5, 6, 7])  # a prompt sharing nothing
    responses.append([8, 9])
    return prompts, responses


def _run(model, batch):
    model.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs(model, batch, temperature=0.7, with_entropy=True)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_shared_prefix_forward_matches_separate_forwards():
    model = tiny_model(seed=3)
    prompts, responses = _grpo_like()
    plain = make_token_batch(prompts, responses, pad_id=0)
    shared = make_token_batch(prompts, responses, pad_id=0, share_prefix=True)
    assert plain.prefix is None and shared.prefix is not None
    # Each group forwards its prompt once: 3 groups of 4 samples save 3 prompts' worth of tokens each.
    saved = sum(3 * len(SYSTEM + [0] * (6 + k)) for k in range(3))
    assert shared.forwarded_tokens == plain.forwarded_tokens - saved
    lp_a, ent_a, grads_a = _run(model, plain)
    lp_b, ent_b, grads_b = _run(model, shared)
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=0)
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_b[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_shared_prefix_with_multi_step_rows_reads_the_packed_sequences():
    """Rows of multi-turn trajectories: step 0 is a prefix of step 1 (packing), and trajectories of
    one prompt share that prompt (sharing); the two compose."""
    model = tiny_model(seed=1)
    prompt = SYSTEM + [50, 51, 52]
    prompts, responses = [], []
    for j in range(3):
        r0 = [60 + j, 61, 2]
        obs = [70, 71 + j]
        prompts += [prompt, prompt + r0 + obs]
        responses += [r0, [80, 81 + j, 82]]
    plain = make_token_batch(prompts, responses, pad_id=0)
    shared = make_token_batch(prompts, responses, pad_id=0, share_prefix=True)
    assert plain.input_ids.size(0) == 3  # one sequence per trajectory
    assert shared.forwarded_tokens < plain.forwarded_tokens
    with torch.no_grad():
        a, _ = response_logprobs(model, plain)
        b, _ = response_logprobs(model, shared)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_groups_share_each_prompt_not_only_the_common_system_prompt():
    prompts, responses = _grpo_like(n_groups=2, samples=4)
    seqs = [p + r for p, r in zip(prompts, responses)]
    groups = shared_prefix_groups(seqs)
    by_len = sorted((sorted(m), p) for m, p in groups)
    # two groups of 4 on their full prompts (36 and 37 tokens), the stray prompt on its own
    assert by_len == [([0, 1, 2, 3], 36), ([4, 5, 6, 7], 37), ([8], 0)]
    assert sorted(i for m, _ in groups for i in m) == list(range(len(seqs)))


@pytest.mark.parametrize("seqs", [[[1, 2, 3], [1, 2, 3, 4]], [[1, 2, 3], [1, 2, 3]]])
def test_a_prefix_never_swallows_a_whole_sequence(seqs):
    for members, p in shared_prefix_groups(seqs, min_prefix=1):
        assert all(p < len(seqs[i]) for i in members)


def test_short_common_prefixes_are_not_shared():
    assert all(p == 0 for _, p in shared_prefix_groups([[1, 2, 3, 9], [1, 2, 3, 8]], min_prefix=8))
    prompts, responses = [[1, 2, 3], [1, 2, 4]], [[5], [6]]
    assert make_token_batch(prompts, responses, pad_id=0, share_prefix=True).prefix is None


def test_update_tensors_share_prompts():
    prompts, responses = _grpo_like(n_groups=2, samples=3)
    rows = [
        {
            "traj_id": f"t{i}",
            "prompt_ids": p,
            "response_ids": r,
            "advantages": [1.0] * len(r),
            "old_logprobs": [-1.0] * len(r),
            "returns": [1.0] * len(r),
        }
        for i, (p, r) in enumerate(zip(prompts, responses))
    ]
    assert step_tensors(rows, 0, per_step_values=False, share_prefix=True).batch.prefix is not None
    assert step_tensors(rows, 0, per_step_values=False).batch.prefix is None


@pytest.mark.parametrize("per_step", [False, True])
def test_critic_values_on_shared_prefixes_match(per_step):
    from transformers import Qwen3ForTokenClassification

    config = tiny_model().config
    config.num_labels = 1
    torch.manual_seed(0)
    critic = Qwen3ForTokenClassification(config).eval()  # eval: no dropout, so both paths are exact
    prompts, responses = _grpo_like()
    grads = []
    values = []
    for share in (False, True):
        critic.zero_grad(set_to_none=True)
        v = critic_values(
            critic, make_token_batch(prompts, responses, pad_id=0, share_prefix=share), per_step=per_step
        )
        v.square().sum().backward()
        values.append(v.detach())
        grads.append({n: p.grad.clone() for n, p in critic.named_parameters()})
    assert values[0].shape == ((len(prompts),) if per_step else (len(prompts), max(map(len, responses))))
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=0)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-5, rtol=1e-4, msg=name)
