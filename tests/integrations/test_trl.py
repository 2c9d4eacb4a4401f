"""lce.integrations.trl: TRL's fused LM head routed through lce, against the fp64 formula and TRL's own head.

Tiny random-init models from configs (2 layers, vocabularies of a few hundred to 4,096 classes), a word-level
tokenizer built in examples/trl_grpo.py, no download (HF_HUB_OFFLINE). The fp64 checks call the model as TRL's
trainers do (``model(..., labels=..., fused_lm_head=True)``) and compare every output and every parameter's
gradient with the formula on the model's own logits: ``log_softmax(logits / T)`` of its unpatched forward, which
applies its logit scale and soft-cap itself. Heads are scaled so that the logits spread over a few nats, as a
trained head's do. The trainer tests (slow) run real ``GRPOTrainer``, ``DPOTrainer`` and ``SFTTrainer`` steps with
the route in place; FSDP2 runs over gloo in two spawned processes.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import math
import os
import sys
import types

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
trl = pytest.importorskip("trl")  # trl's and transformers' packages import their modules when first used
transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("datasets") is None:
    pytest.skip("TRL's trainers need datasets (the hf extra)", allow_module_level=True)

import lce  # noqa: E402
from examples.trl_grpo import (  # noqa: E402
    HEADS,
    grpo_trainer,
    head_ratio_error,
    record_batches,
    sequences,
    tiny_qwen2,
    word_tokenizer,
)
from helpers import assert_import_leaves_out, padded_batch  # noqa: E402
from lce.integrations import transformers as hf_integration  # noqa: E402
from lce.integrations import trl as integration  # noqa: E402

VOCAB, HIDDEN = 384, 32
HEAD_SCALE = 20.0
"""lm_head's weights times this: logits spread over a few nats."""
ALL = integration.OUTPUTS

_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)


def trl_utils() -> types.ModuleType:
    """trl.trainer.utils (imported on first use: it imports most of transformers, datasets and accelerate)."""
    import trl.trainer.utils

    return trl.trainer.utils


def trl_kernels() -> types.ModuleType:
    import trl.kernels.chunked_logprob

    return trl.kernels.chunked_logprob


def add_fused_lm_head(model, **kwargs) -> None:
    trl_utils().add_fused_lm_head(model, **kwargs)


def _qwen2(**config):
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_COMMON, **config))


def _with_bias(model):
    model.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=True)
    torch.nn.init.normal_(model.lm_head.bias, std=2.0)
    return model


FAMILIES = {
    "qwen2": lambda: _qwen2(tie_word_embeddings=False),
    "qwen2-tied": lambda: _qwen2(tie_word_embeddings=True),
    "qwen2-bias": lambda: _with_bias(_qwen2(tie_word_embeddings=False)),
    "gemma2-softcap": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **_COMMON, head_dim=8, query_pre_attn_scalar=8, final_logit_softcapping=3.0)),
    "granite-1/8": lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **_COMMON, logits_scaling=8.0, tie_word_embeddings=False)),
    "granite-1/3": lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **_COMMON, logits_scaling=3.0, tie_word_embeddings=False)),
    "cohere-0.0625": lambda: transformers.CohereForCausalLM(transformers.CohereConfig(
        **_COMMON, logit_scale=0.0625, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "cohere-0.3": lambda: transformers.CohereForCausalLM(transformers.CohereConfig(
        **_COMMON, logit_scale=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
}
"""Untied, tied (the embedding matrix is the head) and biased heads, Gemma 2's soft-cap, Granite's ``1 /
logits_scaling`` (a power of two, and 1/3, which TRL passes as a float) and Cohere's ``logit_scale`` (0.0625 and
0.3): TRL reads each from the config and hands it to its hook."""


def tiny(family: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model.to(dtype).train()


def batch(seed: int = 0, rows: int = 3, length: int = 12):
    return padded_batch(VOCAB, seed, rows, length)


def formula(model, ids, mask, targets, temperature: float, *, shifted: bool = False) -> dict[str, torch.Tensor]:
    """Every output of TRL's fused head from the model's own logits (its unpatched forward: scale and soft-cap
    applied by the model), in the logits' dtype, zero where the target is -100."""
    logits = model(ids, attention_mask=mask).logits  # no fused_lm_head: TRL's forward calls the model's own
    if not shifted:
        logits, targets = logits[:, :-1], targets[:, 1:]
    u = logits / temperature
    log_p = torch.log_softmax(u, -1)
    valid = targets != -100
    safe = targets.clamp(min=0)[..., None]
    outputs = {"log_probs": log_p.gather(-1, safe)[..., 0], "entropy": -(log_p.exp() * log_p).sum(-1),
               "log_sum_sq_probs": torch.logsumexp(2 * log_p, -1), "mean_logits": u.mean(-1),
               "is_top1": u.argmax(-1) == safe[..., 0]}
    return {name: torch.where(valid, value, torch.zeros_like(value)) for name, value in outputs.items()}


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def weighted(outputs: dict[str, torch.Tensor], seed: int = 1) -> torch.Tensor:
    """A scalar of the differentiable outputs with per-token weights (a policy gradient with an entropy bonus)."""
    g = torch.Generator().manual_seed(seed)
    log_probs = outputs["log_probs"]
    a = torch.randn(log_probs.shape, generator=g, dtype=log_probs.dtype)
    b = torch.randn(log_probs.shape, generator=g, dtype=log_probs.dtype)
    return (a * log_probs).sum() + 0.1 * (b * outputs["entropy"]).sum()


class Spy:
    """Records every lce.linear_log_probs call the integration makes: its tensors and autocast's state."""

    def __init__(self, monkeypatch):
        self.calls: list[dict] = []
        real = integration.linear_log_probs

        def spy(input, linear_weight, target, **kwargs):
            self.calls.append(dict(kwargs, input=input, linear_weight=linear_weight, target=target,
                                   autocast=torch.is_autocast_enabled("cpu")))
            return real(input, linear_weight, target, **kwargs)

        monkeypatch.setattr(integration, "linear_log_probs", spy)


@pytest.fixture(autouse=True)
def _trl_left_as_found():
    """Every test leaves TRL's hook and the integration's routes as it found them."""
    yield
    integration._routes.clear()
    if "trl.trainer.utils" in sys.modules:
        trl_utils()._ChunkedLogProbFunction = trl_kernels().ChunkedLogProbFunction


@pytest.fixture(autouse=True)
def _quiet():
    import datasets

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    yield


# ---- fp64: every output and every gradient equal the formula's ----------------------------------------------

@pytest.mark.parametrize(("family", "temperature"),
                         [(family, 0.7) for family in FAMILIES] + [("qwen2", 1.0), ("gemma2-softcap", 1.0)])
def test_fp64_outputs_and_gradients_equal_the_formula(family, temperature, monkeypatch):
    """All five outputs of TRL's fused head through lce, and every parameter's gradient of a policy-gradient loss
    with an entropy bonus, equal the formula's on the model's own fp64 logits to 1e-9 (mostly 1e-13)."""
    model = tiny(family)
    reference = copy.deepcopy(model)
    add_fused_lm_head(model, temperature=temperature, outputs=ALL)
    integration.route(model)
    spy = Spy(monkeypatch)
    ids, mask, labels = batch()
    out = model(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    expected = formula(reference, ids, mask, labels, temperature)
    assert len(spy.calls) == 1 and spy.calls[0]["temperature"] == temperature
    for name in ALL:
        value = getattr(out, name)
        assert value.shape == expected[name].shape == (3, 11), name
        if name == "is_top1":
            assert value.dtype == torch.bool and torch.equal(value, expected[name])
        else:
            assert value.dtype == torch.float64 and (value - expected[name]).abs().max() <= 1e-9, name
    assert not out.mean_logits.requires_grad and not out.is_top1.requires_grad
    weighted(out).backward()
    weighted(expected).backward()
    grads, expected_grads = gradients(model), gradients(reference)
    assert grads.keys() == expected_grads.keys() and len(grads) > 5
    for name, grad in grads.items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-9 * max(1.0, float(expected_grads[name].abs().max())), \
            name


def test_label_shift_shift_labels_and_logits_to_keep_as_trl_scores_them():
    """GRPO expresses ``logits_to_keep`` as labels -100 before the last ``k`` positions; context parallelism passes
    ``shift_labels`` already shifted, which TRL scores without shifting: both as the formula."""
    model = tiny("qwen2")
    reference = copy.deepcopy(model)
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    integration.route(model)
    ids, mask, labels = batch(2)
    kept = labels.clone()
    kept[:, :-4] = -100
    out = model(ids, attention_mask=mask, labels=kept, fused_lm_head=True)
    expected = formula(reference, ids, mask, kept, 0.8)
    assert (out.log_probs - expected["log_probs"]).abs().max() <= 1e-12
    assert int(out.label_mask.sum()) == int((kept[:, 1:] != -100).sum())
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    out = model(ids, attention_mask=mask, shift_labels=shifted, fused_lm_head=True)
    expected = formula(reference, ids, mask, shifted, 0.8, shifted=True)
    assert out.log_probs.shape == ids.shape
    assert (out.log_probs - expected["log_probs"]).abs().max() <= 1e-12
    assert (out.entropy - expected["entropy"]).abs().max() <= 1e-12


# ---- scoping, autocast, undo ----------------------------------------------------------------------------------

def test_only_routed_models_run_lce_and_unroute_gives_trl_its_kernel_back(monkeypatch):
    routed, other = tiny("qwen2", torch.float32), tiny("qwen2", torch.float32, seed=1)
    for model in (routed, other):
        add_fused_lm_head(model, temperature=0.9, outputs=ALL)
    ids, mask, labels = batch(3)
    before = other(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    assert integration.route(routed) is routed and integration.is_routed(routed)
    assert isinstance(trl_utils()._ChunkedLogProbFunction, integration._StandIn)
    spy = Spy(monkeypatch)
    after = other(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    assert not spy.calls  # TRL's own kernel, bit for bit
    assert all(torch.equal(getattr(before, name), getattr(after, name)) for name in ALL)
    routed(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    assert len(spy.calls) == 1
    assert not integration.is_routed(copy.deepcopy(routed))  # a copy is another model
    assert integration.unroute(routed) is routed and not integration.is_routed(routed)
    assert trl_utils()._ChunkedLogProbFunction is trl_kernels().ChunkedLogProbFunction
    routed(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    assert len(spy.calls) == 1
    with pytest.raises(ValueError, match="is not routed"):
        integration.unroute(routed)


def test_under_autocast_lce_takes_the_head_in_bf16_and_cast_lm_head_to_fp32_is_honoured(monkeypatch):
    """Under bf16 autocast (TRL's ``accelerator.autocast()`` with fp32 parameters) lce receives the hidden states
    and the head and takes them in bf16: the outputs are lce's on the bf16 tensors outside autocast, bit for bit.
    With ``cast_lm_head_to_fp32`` TRL hands over fp32 hidden states with autocast off, and lce runs in fp32."""
    spy = Spy(monkeypatch)
    ids, mask, labels = batch(4)
    for cast in (False, True):
        model = tiny("qwen2", torch.float32)
        add_fused_lm_head(model, temperature=0.7, cast_lm_head_to_fp32=cast, outputs=("log_probs", "entropy"))
        integration.route(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        call = spy.calls[-1]
        assert call["autocast"] is not cast and call["input"].dtype == torch.float32
        assert out.log_probs.dtype == torch.float32
        dtype = torch.float32 if cast else torch.bfloat16
        log_probs, entropy = lce.linear_log_probs(call["input"].detach().to(dtype), call["linear_weight"].detach().to(
            dtype), call["target"], temperature=0.7, return_entropy=True)
        valid = labels[:, 1:] != -100
        assert torch.equal(out.log_probs[valid], log_probs.reshape(valid.shape)[valid])
        assert torch.equal(out.entropy[valid], entropy.reshape(valid.shape)[valid])
        out.log_probs.sum().backward()
        assert model.lm_head.weight.grad.dtype == torch.float32 and model.lm_head.weight.grad.abs().max() > 0
        integration.unroute(model)


def test_options_reach_lce(monkeypatch):
    model = tiny("qwen2")
    add_fused_lm_head(model)
    options = lce.LinearCrossEntropyOptions(acc_policy="accurate", batch_chunk_size=8)
    integration.route(model, options=options)
    spy = Spy(monkeypatch)
    ids, mask, labels = batch(5)
    model(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    assert spy.calls[0]["options"] is options and spy.calls[0]["softcap"] is None


# ---- what is refused -----------------------------------------------------------------------------------------

def test_bad_targets_and_a_second_route_are_refused():
    assert integration.check_trl() == trl.__version__
    model = tiny("qwen2")
    with pytest.raises(ValueError, match=r"carries no TRL fused LM head.*add_fused_lm_head"):
        integration.route(model)
    with pytest.raises(TypeError, match="target must be a TRL trainer"):
        integration.route("Qwen/Qwen2-0.5B")
    add_fused_lm_head(model)
    with pytest.raises(TypeError, match="options must be None or a LinearCrossEntropyOptions"):
        integration.route(model, options="accurate")
    integration.route(model)
    with pytest.raises(ValueError, match="routed through lce already"):
        integration.route(model)
    integration.unroute(model)
    patched = hf_integration.patch(copy.deepcopy(model))
    with pytest.raises(ValueError, match=r"patched by lce.integrations.transformers.*unpatch"):
        integration.route(patched)


def test_a_zero_logit_scale_an_unknown_output_and_zero3_are_refused(monkeypatch):
    ids, mask, labels = batch(6)
    zero = transformers.CohereForCausalLM(transformers.CohereConfig(**_COMMON, logit_scale=0.0, pad_token_id=0,
                                                                    bos_token_id=1, eos_token_id=2)).double()
    add_fused_lm_head(zero)
    integration.route(zero)
    with pytest.raises(ValueError, match="CohereForCausalLM's logit scale is 0"):
        zero(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    model = tiny("qwen2")
    add_fused_lm_head(model, outputs=("log_probs", "top_5"))
    integration.route(model)
    with pytest.raises(integration.IncompatibleTRLError, match=r"fused head of Qwen2ForCausalLM for \['top_5'"):
        model(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    weight = torch.randn(VOCAB, HIDDEN, dtype=torch.float64)
    weight.ds_id = 3  # what DeepSpeed ZeRO-3 puts on a partitioned parameter
    with pytest.raises(ValueError, match="ZeRO-3"):
        integration.fused_head(torch.randn(4, HIDDEN, dtype=torch.float64), weight, None,
                               torch.zeros(4, dtype=torch.int64), temperature=1.0, outputs=("log_probs",))
    import transformers.integrations.deepspeed as deepspeed

    monkeypatch.setattr(deepspeed, "is_deepspeed_zero3_enabled", lambda: True)
    fresh = tiny("qwen2")
    add_fused_lm_head(fresh)
    with pytest.raises(ValueError, match="ZeRO-3 partitions the head's weight"):
        integration.route(fresh)


def _forward_taking(*names):
    def forward(*args):
        return None

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature([inspect.Parameter(name, kind) for name in names])
    return forward


TRL_CHANGES = {
    "kernel signature": lambda mp: mp.setattr(trl_kernels().ChunkedLogProbFunction, "forward", staticmethod(
        _forward_taking("ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size", "softcap",
                        "logit_scale", "outputs"))),
    "a new output": lambda mp: mp.setattr(trl_kernels(), "OPTIONAL_OUTPUTS",
                                          (*trl_kernels().OPTIONAL_OUTPUTS, "top_k")),
    "another kernel bound": lambda mp: mp.setattr(trl_utils(), "_ChunkedLogProbFunction", types.SimpleNamespace()),
    "no _fused_forward": lambda mp: mp.setattr(trl_utils(), "add_fused_lm_head", lambda model, **kwargs: None),
}
"""Ways a TRL upgrade could move the hook: each must fail route() loudly, naming the installed TRL version."""


@pytest.mark.parametrize("change", TRL_CHANGES)
def test_a_trl_whose_hook_changed_fails_route_naming_its_version(change, monkeypatch):
    model = tiny("qwen2")
    add_fused_lm_head(model)
    TRL_CHANGES[change](monkeypatch)
    with pytest.raises(integration.IncompatibleTRLError, match=rf"in the installed trl {trl.__version__}, .*pin trl=="):
        integration.route(model)
    assert not integration.is_routed(model)


def test_a_hook_replaced_after_route_is_not_dropped_by_unroute(monkeypatch):
    model = tiny("qwen2")
    add_fused_lm_head(model)
    integration.route(model)
    monkeypatch.setattr(trl_utils(), "_ChunkedLogProbFunction", trl_kernels().ChunkedLogProbFunction)
    with pytest.raises(ValueError, match="replaced after route"):
        integration.unroute(model)


# ---- trainers (slow): GRPO in fp64 and bf16, DPO, SFT ------------------------------------------------------

class Formula:
    """TRL's hook computed from materialized logits in the input's dtype (the reference a routed call must match):
    ``z = hidden @ weight.T + bias``, times the scale, soft-capped, over the temperature, then log-softmax."""

    def apply(self, hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0,
              outputs=ALL[1:]):
        z = hidden @ weight.to(hidden.dtype).T
        if bias is not None:
            z = z + bias.to(hidden.dtype)
        z = z * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        log_p = torch.log_softmax(z / temperature, -1)
        entropy = -(log_p.exp() * log_p).sum(-1) if "entropy" in outputs else None
        return log_p.gather(-1, targets[:, None])[:, 0], entropy, None, None, None


def _grpo_loss_gradients(trainer, inputs) -> tuple[float, dict[str, torch.Tensor]]:
    model = trainer.model
    model.zero_grad(set_to_none=True)
    loss = type(trainer)._compute_loss(trainer, model, inputs)
    loss.backward()
    return loss.detach().item(), gradients(model)


@pytest.mark.slow
def test_a_grpo_step_in_fp64_gives_the_formulas_log_probs_and_loss_gradients(tmp_path, monkeypatch):
    """A real GRPOTrainer step (fp64, a KL penalty, so a reference model too, T = 0.7) with both models routed;
    then, on the batch it trained on, TRL's own GRPO loss and every parameter's gradient through the routed head
    equal those through the fp64 formula to 1e-9, and so do the reference model's log-probabilities."""
    vocab = 512
    model = tiny_qwen2(tmp_path / "model", vocab=vocab, hidden=HIDDEN, dtype=torch.float64)
    trainer = grpo_trainer(model, word_tokenizer(vocab), tmp_path, temperature=0.7, bf16=False)
    integration.route(trainer)
    assert integration.is_routed(trainer.model) and integration.is_routed(trainer.ref_model)
    spy = Spy(monkeypatch)
    batches = record_batches(trainer)
    trainer.train()
    heads = {id(call["linear_weight"]) for call in spy.calls}
    assert heads == {id(trainer.model.lm_head.weight), id(trainer.ref_model.lm_head.weight)}
    assert all(call["temperature"] == 0.7 and call["return_entropy"] for call in spy.calls
               if call["linear_weight"] is trainer.model.lm_head.weight)
    inputs = batches[-1]
    assert inputs["advantages"].abs().max() > 0 and math.isfinite(trainer.state.log_history[0]["loss"])
    loss, grads = _grpo_loss_gradients(trainer, inputs)
    integration.unroute(trainer)
    monkeypatch.setattr(trl_utils(), "_ChunkedLogProbFunction", Formula())
    expected_loss, expected = _grpo_loss_gradients(trainer, inputs)
    assert abs(loss - expected_loss) <= 1e-9 and grads.keys() == expected.keys() and len(grads) > 5
    for name, grad in grads.items():
        assert (grad - expected[name]).abs().max() <= 1e-9, name
    assert max(float(g.abs().max()) for g in grads.values()) > 1e-3
    ids, mask, _ = sequences(inputs)
    keep = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        reference, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, keep)
    assert (inputs["ref_per_token_logps"] - reference).abs().max() <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_bf16_grpo_step_and_the_importance_ratio_error_on_its_batch(temperature, tmp_path, monkeypatch):
    """A GRPOTrainer step with bf16=True (fp32 parameters under bf16 autocast), routed; on the batch it trained
    on (vocabulary 4,096, logits spread over 3 nats), the worst importance-ratio error |exp(log p - log p_fp64) - 1|
    of TRL's default head is above 1e-2, lce's (default options, and balanced with fp32 results, the CUDA default)
    at most 1e-5 -- as TRL's fp32 head's, without its fp32 copy (examples/trl_grpo.py prints the table)."""
    vocab = 4096
    model = tiny_qwen2(tmp_path / "model", vocab=vocab)
    trainer = grpo_trainer(model, word_tokenizer(vocab), tmp_path, temperature=temperature, bf16=True)
    integration.route(trainer)
    spy = Spy(monkeypatch)
    batches = record_batches(trainer)
    trainer.train()
    assert spy.calls and all(call["autocast"] for call in spy.calls)
    assert math.isfinite(trainer.state.log_history[0]["loss"])
    integration.unroute(trainer)
    errors = {head: head_ratio_error(trainer.model, batches[-1], head, temperature=temperature) for head in HEADS}
    assert errors["trl"] > 1e-2, errors
    assert errors["lce"] <= 1e-5 and errors["lce balanced"] <= 1e-5, errors
    assert errors["trl cast_lm_head_to_fp32"] <= 1e-5, errors


def _words(count: int, seed: int, vocab: int, length: int = 5) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(f"w{int(i)}" for i in torch.randint(3, vocab, (length,), generator=g)) for _ in range(count)]


def _one_fp32_step(config_class, tmp_path):
    """A trainer config for one logged fp32 step on the CPU, batches of 4, nothing saved or reported."""
    return config_class(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=1, use_cpu=True,
                        bf16=False, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
                        learning_rate=1e-3)


def _train(make_trainer, *, routed: bool, monkeypatch) -> tuple[dict, Spy]:
    trainer = make_trainer()
    trainer.remove_callback(transformers.PrinterCallback)
    if routed:
        integration.route(trainer)
    spy = Spy(monkeypatch)
    trainer.train()
    if routed:
        integration.unroute(trainer)
    return trainer.state.log_history[0], spy


@pytest.mark.slow
def test_a_dpo_step_routed_logs_what_trls_head_logs(tmp_path, monkeypatch):
    """DPOTrainer asks the fused head for log_probs, entropy, mean_logits and is_top1 (its logits/* and
    mean_token_accuracy metrics) on the policy and log_probs on the reference model: routed, one fp32 step logs
    the loss and every metric TRL's own head logs, to fp32's rounding."""
    import datasets

    vocab = 512
    data = datasets.Dataset.from_dict({"prompt": _words(4, 0, vocab), "chosen": _words(4, 1, vocab),
                                       "rejected": _words(4, 2, vocab)})

    def make():
        model = tiny_qwen2(tmp_path / "model", vocab=vocab, hidden=HIDDEN)
        args = _one_fp32_step(trl.DPOConfig, tmp_path)
        return trl.DPOTrainer(model=model, args=args, train_dataset=data, processing_class=word_tokenizer(vocab))

    ours, spy = _train(make, routed=True, monkeypatch=monkeypatch)
    theirs, none = _train(make, routed=False, monkeypatch=monkeypatch)
    assert len(spy.calls) >= 2 and not none.calls
    metrics = ("loss", "entropy", "logits/chosen", "logits/rejected", "logps/chosen", "logps/rejected",
               "mean_token_accuracy", "grad_norm")
    for name in metrics:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_an_sft_step_routed_trains_as_trls_head(tmp_path, monkeypatch):
    """SFTTrainer's loss is the fused head's negative log-likelihood; it also asks for the entropy and is_top1
    (mean_token_accuracy): routed, one fp32 step logs the loss, gradient norm and metrics TRL's head logs."""
    import datasets

    vocab = 512
    data = datasets.Dataset.from_dict({"text": _words(8, 3, vocab, length=7)})

    def make():
        model = tiny_qwen2(tmp_path / "model", vocab=vocab, hidden=HIDDEN)
        args = _one_fp32_step(trl.SFTConfig, tmp_path)
        return trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=word_tokenizer(vocab))

    ours, spy = _train(make, routed=True, monkeypatch=monkeypatch)
    theirs, _ = _train(make, routed=False, monkeypatch=monkeypatch)
    assert spy.calls and all(call["return_entropy"] for call in spy.calls)
    for name in ("loss", "grad_norm", "entropy", "mean_token_accuracy"):
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-6), name


# ---- FSDP2 over gloo (slow): TRL gathers the head with full_tensor(), lce gets a plain weight -----------------

def _fsdp_rank(rank: int, world: int, rendezvous: str, out: str) -> None:
    """One rank: a tiny fp64 Qwen2 with TRL's fused head, routed, then ``fully_shard`` (the root alone, then with
    ``lm_head`` a unit of its own, whose weight TRL then finds sharded and gathers); a weighted sum of the
    log-probabilities and entropies, backward, and the errors against the formula on an unsharded copy."""
    import datetime

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        mesh = init_device_mesh("cpu", (world,))
        for split in (False, True):
            model = tiny("qwen2")
            reference = copy.deepcopy(model)
            add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
            integration.route(model)
            if split:
                fully_shard(model.lm_head, mesh=mesh)
            fully_shard(model, mesh=mesh)
            seen = []
            real = integration.linear_log_probs

            def spy(input, linear_weight, target, _model=model, _seen=seen, _real=real, **kwargs):
                _seen.append((not isinstance(linear_weight, DTensor) and linear_weight.shape == (VOCAB, HIDDEN),
                              isinstance(_model.lm_head.weight, DTensor)))
                return _real(input, linear_weight, target, **kwargs)

            integration.linear_log_probs = spy
            ids, mask, labels = batch()  # the same batch on every rank: the averaged gradient is one batch's
            fused = model(ids, attention_mask=mask, labels=labels, fused_lm_head=True)
            weighted(fused).backward()
            integration.linear_log_probs = real
            expected = formula(reference, ids, mask, labels, 0.7)
            weighted(expected).backward()
            errors = [float((getattr(fused, name) - expected[name]).abs().max()) for name in ("log_probs", "entropy")]
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                errors.append(float((grad - q.grad).abs().max()))
            integration.unroute(model)
            results[split] = dict(error=max(errors), seen=seen)
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="needs torch.distributed with gloo")
def test_fsdp2_over_gloo_the_gathered_head_runs_through_lce(tmp_path):
    """Two CPU processes, FSDP2: with lm_head in the root unit, forward hands TRL the unsharded weight; with
    lm_head a unit of its own, TRL finds it sharded (a DTensor) and gathers it with full_tensor(). Either way lce
    receives a plain full weight, and the log-probabilities, entropies and every gradient (the head's reduced to
    its shards through full_tensor's backward) equal the single-process formula's to 1e-9."""
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_rank, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for split, result in results.items():
            assert result["error"] <= 1e-9, (rank, split, result)
            assert result["seen"] == [(True, split)], (rank, split, result)


@pytest.mark.slow
def test_import_lce_and_the_integration_leave_trl_unimported():
    assert_import_leaves_out("lce.integrations.trl", ["trl", "transformers"])
