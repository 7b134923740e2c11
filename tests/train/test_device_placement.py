"""Every function that feeds a model puts its inputs on the model's device: fake-CUDA tests.

No GPU was available to this project, so the GPU path is proven here with fake CUDA tensors on a
CPU-only torch: the tiny model's parameters become ``FakeTensor``s reporting ``cuda:0`` (metadata
only, no data), and any op mixing one with a real CPU tensor raises ``FakeTensorDeviceMismatchError``,
as a real GPU would raise "Expected all tensors to be on the same device". Each test builds its
batch exactly as the stage does (on the CPU: ``collate``, ``step_tensors``, ``make_token_batch``,
``HFEngine.prompt_batch``) and runs the stage's own code with nothing patched but the model (and
DeepSpeed's ``train_step``, see below); ``components.device.to_device`` is the real seam.

The ``FakeCuda`` harness (a torch-function mode) makes this work on a CPU-only build:
- ``Tensor.to("cuda")`` / ``.cuda()`` of a CPU tensor returns a fake CUDA tensor (the real call
  raises "not compiled with CUDA");
- ops on fake CUDA tensors run with their fake device set to ``meta`` and the results are labelled
  ``cuda:0`` again: Python indexing and SDPA ask for a CUDA device guard that a CPU-only torch has
  not. A mismatch is then reported with the devices named ``cuda:0`` and ``cpu``;
- factory calls with ``device=cuda`` make fake tensors;
- ``tolist``/``item``/``int``/``float`` of a fake tensor return zeros (a fake has no data).

Covered (model inputs on the model's device):
- SFT: ``sft_hidden`` (what ``sft_loss_fn`` forwards) on a ``collate`` micro-batch;
- RL annotate: ``RLSession.annotate`` as a whole: old log-probs (actor), reference log-probs (the
  frozen reference, placed beside the actor) and critic values (per token and per step);
- RL update: the actor's and the critic's ``loss_fn`` inside ``actor_update``/``critic_update`` (the
  forward and the loss terms, i.e. everything before ``engine.backward``), with ``train_step``
  replaced by a loop that calls ``loss_fn`` under ``no_grad``;
- rollout, validation and evaluation on the ``hf`` engine: ``HFEngine.generate`` puts the prompts
  on the model's device and its log-prob hook runs there (validation and evaluation only call
  ``generate`` of the rollout engine).

Not covered, and why:
- the DeepSpeed engine itself (``deepspeed.initialize``, ``engine.backward``/``step``, ZeRO, NCCL):
  it needs a real accelerator and a process group; here the engine is a stand-in holding ``module``;
- backward passes: autograd through fake parameters aborts a CPU-only torch, so every forward runs
  under ``torch.no_grad()``;
- vLLM: it runs its own CUDA workers (and sleep mode needs CUDA's memory allocator);
- ``transformers.generate`` internals: its stopping checks read tensor values, which fakes do not
  have; the test's stand-in ``generate`` runs the model's forwards the way ``generate`` does;
- code that reads values (e.g. ``common_prefix`` deciding whether rows share a prefix sees zeros, so
  the SFT test takes the unshared path; ``RLSession.annotate`` stores zeros).
``make gpu-smoke`` (``benchmarks/gpu_smoke.py``) runs the real thing on a GPU machine.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import (
    FakeTensor,
    FakeTensorDeviceMismatchError,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from train_helpers import ACTOR_KW, run_actor_update, run_critic_update, session_config, tiny_model

from components.device import model_device, stage_device, to_device
from components.model.sft_data import collate
from components.rollout.base import SamplingConfig
from components.rollout.hf_engine import HFEngine
from components.train import rl_update
from components.train.policy import make_token_batch
from components.train.rl_session import RLSession, SessionConfig
from components.train.sft import sft_hidden

CUDA = torch.device("cuda", 0)
META = torch.device("meta")
_VALUE_READS = (torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__)


def _is_fake_cuda(t: object) -> bool:
    return isinstance(t, FakeTensor) and t.fake_device.type == "cuda"


def _is_cuda_device(d: object) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return isinstance(d, str) and (d == "cuda" or d.startswith("cuda:"))


def _check_embedding(*args, **kwargs) -> None:
    ids = kwargs.get("input", args[0] if args else None)
    weight = kwargs.get("weight", args[1] if len(args) > 1 else None)
    if _is_fake_cuda(weight) and not _is_fake_cuda(ids):
        raise FakeTensorDeviceMismatchError(torch.ops.aten.embedding.default, CUDA, ids.device)


class FakeCuda(TorchFunctionMode):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(self, t: torch.Tensor) -> FakeTensor:
        """A fake CUDA tensor with ``t``'s shape, dtype and strides."""
        with unset_fake_temporarily():
            return FakeTensor(self.fake_mode, t.detach().to("meta"), CUDA)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cuda) and self._to_cuda(func, args, kwargs):
            t = args[0]
            dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
            if not _is_fake_cuda(t):
                return self.fake(t if dtype is None else t.to(dtype))
            if dtype is None or dtype == t.dtype:
                return t
            args, kwargs = (t, dtype), {}  # already there: only the dtype changes
        if func in _VALUE_READS and _is_fake_cuda(args[0]):
            with unset_fake_temporarily():
                return func(torch.zeros(args[0].shape, dtype=args[0].dtype))
        flat = tree_flatten((args, kwargs))[0]
        fakes = [t for t in flat if _is_fake_cuda(t)]
        makes_cuda = any(_is_cuda_device(d) for d in flat)
        if not fakes and not makes_cuda:
            return func(*args, **kwargs)  # real CPU work (batch building)
        if not fakes:
            with self.fake_mode:  # torch.arange(..., device="cuda") and friends
                return func(*args, **kwargs)
        if func in (torch.nn.functional.embedding, torch.embedding):
            _check_embedding(*args, **kwargs)  # its fake kernel skips the check on meta weights
        for t in fakes:
            t.fake_device = META
        try:
            with self.fake_mode:
                out = func(*args, **kwargs)
        except FakeTensorDeviceMismatchError as err:
            named = [CUDA if d.type == "meta" else d for d in (err.common_device, err.device)]
            raise FakeTensorDeviceMismatchError(err.func, *named) from None
        finally:
            for t in fakes:
                t.fake_device = CUDA
        for o in tree_flatten(out)[0]:
            if isinstance(o, FakeTensor) and o.fake_device == META:
                o.fake_device = CUDA
        return out

    @staticmethod
    def _to_cuda(func, args, kwargs) -> bool:
        if func is torch.Tensor.cuda:
            return True
        return any(_is_cuda_device(a) for a in (kwargs.get("device"), *args[1:]))


def fake_cuda_model(model: torch.nn.Module, fc: FakeCuda) -> torch.nn.Module:
    """``model`` with every parameter and buffer replaced by a fake CUDA tensor (in place)."""
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = torch.nn.Parameter(fc.fake(p), requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = fc.fake(b)
    return model


def tiny_critic(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3ForTokenClassification

    cfg = tiny_model(seed).config
    cfg.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForTokenClassification(cfg)


class Engine:
    """The part of a DeepSpeed engine the stages read: ``module``, ``eval``/``train``, the dtype."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.steprl_dtype = "fp32"

    def eval(self) -> None:
        self.module.eval()

    def train(self) -> None:
        self.module.train()


@pytest.fixture
def fc():
    mode = FakeCuda()
    with mode:
        yield mode


# --- rows as the rollout and advantage stages leave them --------------------------------------------
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def step_rows() -> list[dict]:
    """Two trajectories of two steps, in one group (shared prompt, so make_token_batch shares prefixes)."""
    rows = []
    for t in range(2):
        first = [*PROMPT, 20 + t]
        resp0, resp1 = [30 + t, 31], [40 + t, 41, 42]
        second = [*first, *resp0, 50, 51]
        for prompt, resp in ((first, resp0), (second, resp1)):
            n = len(resp)
            rows.append(
                {
                    "prompt_ids": prompt,
                    "response_ids": resp,
                    "response_logprobs": [-1.0] * n,
                    "old_logprobs": [-1.0] * n,
                    "ref_logprobs": [-1.1] * n,
                    "advantages": [0.5] * n,
                    "returns": [1.0] * n,
                    "values": [0.1] * n,
                    "traj_id": f"t{t}",
                    "group_id": "g0",
                }
            )
    return rows


# --- the seam itself (real tensors) -------------------------------------------------------------------
def test_to_device_moves_every_tensor_of_a_token_batch_and_keeps_the_rest():
    rows = step_rows()
    batch = make_token_batch(
        [r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], 0, share_prefix=True, packed=True
    )
    assert batch.prefix is not None
    moved = to_device({"batch": batch, "n": 3, "none": None, "pair": (torch.ones(2), "x")}, "meta")
    nested = ("prefix", "packed")
    fields = [getattr(moved["batch"], f.name) for f in dataclasses.fields(batch) if f.name not in nested]
    for name in nested:  # the shared prefixes and the packed layout: dataclasses of tensors
        fields += [
            getattr(getattr(moved["batch"], name), f.name) for f in dataclasses.fields(getattr(batch, name))
        ]
    assert all(t.device.type == "meta" for t in fields)
    assert moved["n"] == 3 and moved["none"] is None and moved["pair"][1] == "x"
    assert moved["pair"][0].device.type == "meta"
    assert batch.input_ids.device.type == "cpu"  # the original is untouched
    same = torch.ones(2)
    assert to_device(same, "cpu") is same


def test_stage_device_is_cuda_local_rank_with_a_cuda_accelerator(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert stage_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert stage_device() == torch.device("cuda", 3)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # DeepSpeed was told to use the CPU
    assert stage_device() == torch.device("cpu")


# --- the harness catches what a GPU would -------------------------------------------------------------
def test_the_harness_raises_on_a_cpu_batch_and_not_on_a_moved_one(fc):
    model = fake_cuda_model(tiny_model(), fc)
    ids = torch.randint(4, 100, (2, 8))
    assert model_device(model) == CUDA
    with torch.no_grad():
        with pytest.raises(FakeTensorDeviceMismatchError, match="cuda:0"):
            model(input_ids=ids)
        out = model(input_ids=to_device(ids, model_device(model)))
    assert out.logits.device == CUDA and out.logits.shape == (2, 8, model.config.vocab_size)


# --- SFT ------------------------------------------------------------------------------------------------
def test_sft_forward_feeds_the_collated_micro_batch_on_the_model_device(fc):
    model = fake_cuda_model(tiny_model(), fc)
    examples = [([*PROMPT, 30, 31, 2], [-100] * 10 + [30, 31, 2]), ([*PROMPT, 40, 2], [-100] * 10 + [40, 2])]
    micro_batch = collate(examples, pad_id=0)  # as flows/sft.py builds it
    with torch.no_grad():
        hidden, labels, _ = sft_hidden(model, micro_batch)
    assert hidden.device == CUDA and labels.device == CUDA


# --- RL annotate ----------------------------------------------------------------------------------------
def _session(fc, *, critic: str | None, use_ref: bool, old_logprobs: str = "recompute") -> RLSession:
    """An RLSession holding fake CUDA models (its __init__ builds DeepSpeed engines and a rollout engine)."""
    cfg = dataclasses.replace(_session_cfg(use_ref=use_ref), critic=critic, old_logprobs=old_logprobs)
    s = object.__new__(RLSession)
    s.cfg, s.pad_id = cfg, 0
    s.actor = Engine(fake_cuda_model(tiny_model(), fc))
    s.critic = Engine(fake_cuda_model(tiny_critic(), fc)) if critic else None
    s.ref = fake_cuda_model(tiny_model(1), fc) if use_ref else None
    return s


@pytest.mark.parametrize("critic", ["token", "step"])
def test_annotate_runs_actor_reference_and_critic_on_their_device(fc, critic):
    session = _session(fc, critic=critic, use_ref=True)
    out = session.annotate(step_rows(), batch_size=4)
    n = [len(r["response_ids"]) for r in out]
    assert [len(r["old_logprobs"]) for r in out] == n
    assert [len(r["ref_logprobs"]) for r in out] == n
    assert [len(r["values"]) for r in out] == (n if critic == "token" else [1] * len(out))


def test_annotate_with_rollout_logprobs_runs_only_reference_and_critic(fc):
    session = _session(fc, critic="token", use_ref=True, old_logprobs="rollout")
    out = session.annotate(step_rows())
    assert all(r["old_logprobs"] == r["response_logprobs"] for r in out)


def test_the_reference_model_is_placed_beside_the_actor(monkeypatch):
    """RLSession.__init__ moves the frozen reference to the actor's device (DeepSpeed moved the actor)."""
    from components.train import rl_session

    class Loaded(torch.nn.Linear):
        moved_to = None

        def to(self, device):  # record instead of moving (no GPU here)
            Loaded.moved_to = device
            return self

    actor = SimpleNamespace(module=torch.nn.Linear(1, 1).to("meta"))  # "the actor's device": meta
    import transformers  # rl_session imports its model classes from it when a session starts

    monkeypatch.setattr(transformers, "AutoTokenizer", SimpleNamespace(from_pretrained=lambda d: _Tok()))
    monkeypatch.setattr(rl_session, "ChatRenderer", lambda *a, **k: None)
    monkeypatch.setattr(rl_session, "build_engine", lambda *a, **k: actor)
    monkeypatch.setattr(
        transformers, "AutoModelForCausalLM", SimpleNamespace(from_pretrained=lambda d: Loaded(1, 1))
    )
    monkeypatch.setattr(rl_session, "make_engine", lambda *a, **k: None)
    session = RLSession("/nowhere", _session_cfg(use_ref=True), tools=None)
    assert Loaded.moved_to == torch.device("meta") and session.ref is not None


class _Tok:
    pad_token_id = 0
    eos_token_id = 2
    eos_token = "<eos>"


def _session_cfg(*, use_ref: bool) -> SessionConfig:
    return session_config(use_ref=use_ref)


# --- RL update: the loss forwards -------------------------------------------------------------------------
def _forward_only_train_step(engine, micro_batches, loss_fn):
    """``train_step`` without DeepSpeed and without backward: each micro-batch's loss_fn under no_grad."""
    out = {}
    with torch.no_grad():
        for m in micro_batches:
            loss, _ = loss_fn(engine, m)
            assert loss.device == model_device(engine.module)
            out["loss"] = 0.0
    return out


UPDATE_KW = dict(epochs=1, mini_batch_size=4, micro_batch_size=2, seed=0)


@pytest.mark.parametrize("kl_coef, entropy_coef, detach_old", [(0.1, 0.01, False), (0.0, 0.0, True)])
def test_actor_loss_forward_runs_on_the_actor_device(fc, monkeypatch, kl_coef, entropy_coef, detach_old):
    monkeypatch.setattr(rl_update, "train_step", _forward_only_train_step)
    engine = Engine(fake_cuda_model(tiny_model(), fc))
    kw = {**ACTOR_KW, **UPDATE_KW, "kl_coef": kl_coef, "entropy_coef": entropy_coef}
    run_actor_update(engine, step_rows(), detach_old=detach_old, **kw)


@pytest.mark.parametrize("per_step", [False, True])
def test_critic_loss_forward_runs_on_the_critic_device(fc, monkeypatch, per_step):
    monkeypatch.setattr(rl_update, "train_step", _forward_only_train_step)
    engine = Engine(fake_cuda_model(tiny_critic(), fc))
    rows = step_rows()
    if per_step:
        for r in rows:
            r["returns"], r["values"] = [1.0], [0.1]
    run_critic_update(engine, rows, pad_id=0, per_step=per_step, value_clip=0.2, **UPDATE_KW)


# --- rollout / validation / evaluation on the hf engine ------------------------------------------------------
def test_hf_engine_generates_from_prompts_on_the_model_device(fc):
    engine = object.__new__(HFEngine)
    engine.model = fake_cuda_model(tiny_model(), fc)
    engine.stop_token_ids, engine.pad_id = [2], 0
    new_tokens = 3

    def generate(*, input_ids, attention_mask, max_new_tokens, **kw):
        """What transformers' generate does to the model: a prefill, then one forward per new token
        (each fed the token sampled from the previous one), all on input_ids' device."""
        ids, mask = input_ids, attention_mask
        out = engine.model(input_ids=ids, attention_mask=mask, use_cache=True)
        for _ in range(new_tokens):
            tok = torch.full((ids.size(0), 1), 7, dtype=torch.long, device=ids.device)
            ids = torch.cat([ids, tok], dim=1)
            mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
            if ids.size(1) - input_ids.size(1) < new_tokens:
                out = engine.model(
                    input_ids=tok, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True
                )
        return ids

    engine.model.generate = generate
    out = engine.generate([PROMPT, PROMPT[:4]], SamplingConfig(max_tokens=new_tokens, n=2), seeds=[0, 1])
    assert [len(g.token_ids) for gens in out for g in gens] == [new_tokens] * 4
    assert [len(g.logprobs) for gens in out for g in gens] == [new_tokens] * 4
