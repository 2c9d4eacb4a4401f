"""lce.integrations.transformers: a patched causal LM returns the library's own loss and gradients.

Tiny random-init models of several families (hidden 32, 2 layers, 256 classes), seeded. The fp64 checks compare
with the unpatched model whose loss is transformers' own ``ForCausalLMLoss`` with its ``logits.float()`` kept in
fp64 (for fp64 logits that upcast is a downcast to fp32, which would hide everything below 1e-7). The bf16 checks
measure both models against fp64 on the same rounded weights; their heads are scaled so the logits spread over
tens of nats, as a trained head's do (a random-init head's softmax is uniform, which makes rounding errors
coherent and comparisons between implementations a matter of luck). Granite and Cohere scale their logits by a
constant (a power of two in one family, not in the other), which the integration maps to scaled hidden states.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import lce
from lce.integrations import transformers as integration

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402

from helpers import assert_import_leaves_out, padded_batch  # noqa: E402

VOCAB, HIDDEN = 256, 32
SOFTCAP = 2.0
"""Gemma's final_logit_softcapping in the tiny configs: small, so that it bites on a scaled head."""
HEAD_SCALE = 30.0
"""lm_head's weights times this: logits of a few to tens of nats."""
GRANITE_SCALING = 8.0
"""Granite's logits_scaling in FAMILIES (its logits divided by it): a power of two, as Granite 3.x's 8 and 16."""
COHERE_SCALE = 0.3
"""Cohere's logit_scale in FAMILIES (its logits multiplied by it): not a power of two (its default is 0.0625)."""

_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)
FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_COMMON, tie_word_embeddings=False)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**_COMMON)),
    "qwen2-tied": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_COMMON, tie_word_embeddings=True)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_COMMON, head_dim=8,
                                                                            tie_word_embeddings=False)),
    "gemma2-softcap": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **_COMMON, head_dim=8, query_pre_attn_scalar=8, final_logit_softcapping=SOFTCAP)),
    "gemma3-softcap": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **_COMMON, head_dim=8, query_pre_attn_scalar=8, final_logit_softcapping=SOFTCAP)),
    "gpt2-tied": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)),
    "mixtral-router-loss": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **_COMMON, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)),
    "granite-scaled": lambda: granite(GRANITE_SCALING),
    "cohere-scaled": lambda: cohere(COHERE_SCALE),
}
"""Decoder-only causal LMs: untied and tied heads (Qwen2, Gemma, GPT-2, Cohere: the embedding matrix), Gemma's
soft-cap, Granite's and Cohere's logit scales, a base model named ``transformer`` (GPT-2), and a mixture of experts
whose forward adds its router loss."""


def granite(logits_scaling: float):
    return transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **_COMMON, logits_scaling=logits_scaling, tie_word_embeddings=False))


def cohere(logit_scale: float):
    return transformers.CohereForCausalLM(transformers.CohereConfig(
        **_COMMON, logit_scale=logit_scale, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def logit_transform(config, logits: torch.Tensor) -> torch.Tensor:
    """What the tiny families' forwards apply to lm_head's output (none applies more than one of these)."""
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    if getattr(config, "logits_scaling", None) is not None:
        logits = logits / config.logits_scaling
    if getattr(config, "logit_scale", None) is not None:
        logits = logits * config.logit_scale
    return logits


def tiny(family: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    if family.startswith("mixtral"):
        model.set_experts_implementation("eager")  # the grouped GEMM has no fp64 kernel
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model.to(dtype).train()


def batch(seed: int = 0, rows: int = 3, length: int = 12):
    return padded_batch(VOCAB, seed, rows, length)


def library_loss_in_fp64(*args, **kwargs):
    """transformers' ForCausalLMLoss with its ``logits.float()`` leaving fp64 logits in fp64."""
    upcast = torch.Tensor.float

    def keep_fp64(self, *more, **options):
        return self if self.dtype == torch.float64 else upcast(self, *more, **options)

    with mock.patch.object(torch.Tensor, "float", keep_fp64):
        return ForCausalLMLoss(*args, **kwargs)


def fp64_library(model):
    reference = copy.deepcopy(model)
    reference.loss_function = library_loss_in_fp64
    return reference


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def step(model, *args, **kwargs):
    """One forward with ``kwargs`` and its backward; returns the output and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    out = model(*args, **kwargs)
    out.loss.backward()
    return out, gradients(model)


class Spy:
    """Records the arguments of every lce.linear_cross_entropy call the integration makes."""

    def __init__(self, monkeypatch):
        self.calls: list[dict] = []
        real = integration.linear_cross_entropy

        def spy(input, linear_weight, target, **kwargs):
            self.calls.append(dict(kwargs, input=input, linear_weight=linear_weight))
            return real(input, linear_weight, target, **kwargs)

        monkeypatch.setattr(integration, "linear_cross_entropy", spy)


# ---- fp64: the library's loss and every gradient ------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_fp64_loss_and_every_gradient_equal_the_librarys(family, monkeypatch):
    model = tiny(family)
    reference = fp64_library(model)
    spy = Spy(monkeypatch)
    integration.patch(model)
    ids, mask, labels = batch()
    out, grads = step(model, ids, attention_mask=mask, labels=labels)
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels)
    assert out.logits is None and out.loss.dtype == torch.float64
    assert abs(out.loss.item() - expected.loss.item()) <= 1e-10
    assert grads.keys() == expected_grads.keys() and len(grads) > 5
    for name, grad in grads.items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-10, name
    assert len(spy.calls) == 1 and spy.calls[0]["softcap"] == (SOFTCAP if "softcap" in family else None)
    if family == "mixtral-router-loss":  # the model's own router loss is in the loss it returns
        assert out.aux_loss is not None and out.aux_loss.item() > 0


def test_a_tied_head_gets_the_gradient_of_both_uses():
    model = tiny("qwen2-tied")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    reference = fp64_library(model)
    integration.patch(model)
    ids, mask, labels = batch(1)
    _, grads = step(model, ids, attention_mask=mask, labels=labels)
    _, expected = step(reference, ids, attention_mask=mask, labels=labels)
    rows = ids.unique()  # the embedding's share lands on the rows of the tokens seen, the head's on every row
    unseen = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, rows, False)
    assert grads["model.embed_tokens.weight"][unseen].abs().max() > 0
    assert (grads["model.embed_tokens.weight"] - expected["model.embed_tokens.weight"]).abs().max() <= 1e-10


def test_gradient_accumulation_with_num_items_in_batch_equals_one_large_batch():
    model = tiny("llama")
    ids, mask, labels = batch(2, rows=4)
    whole = copy.deepcopy(model)
    integration.patch(model)
    integration.patch(whole)
    items = (labels[:, 1:] != -100).sum()
    model.zero_grad()
    total = 0.0
    for part in (slice(0, 1), slice(1, 4)):  # unequal micro-batches, as the Trainer's last ones can be
        out = model(ids[part], attention_mask=mask[part], labels=labels[part], num_items_in_batch=items)
        out.loss.backward()
        total += out.loss.item()
    expected, expected_grads = step(whole, ids, attention_mask=mask, labels=labels)
    assert abs(total - expected.loss.item()) <= 1e-12
    for name, grad in gradients(model).items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-12, name
    library, _ = step(fp64_library(whole), ids, attention_mask=mask, labels=labels, num_items_in_batch=items)
    assert abs(total - library.loss.item()) <= 1e-12


def test_shift_labels_and_logits_to_keep_as_the_library():
    model = tiny("mistral")
    reference = fp64_library(model)
    integration.patch(model)
    ids, mask, labels = batch(3)
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()  # transformers views it
    kept = shifted[:, -5:].contiguous()
    for kwargs in (dict(shift_labels=shifted), dict(logits_to_keep=5, shift_labels=kept)):
        out, grads = step(model, ids, attention_mask=mask, labels=labels, **kwargs)
        expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels, **kwargs)
        assert abs(out.loss.item() - expected.loss.item()) <= 1e-10
        assert all((g - expected_grads[n]).abs().max() <= 1e-10 for n, g in grads.items())
    with pytest.raises(ValueError, match=r"36 label positions for 15 rows of hidden states \(logits_to_keep"):
        model(ids, labels=labels, logits_to_keep=5)


def test_all_ignored_labels_give_the_librarys_nan_mean_and_zero_sum():
    model = tiny("llama")
    reference = fp64_library(model)
    integration.patch(model)
    ids, mask, _ = batch()
    labels = torch.full_like(ids, -100)
    assert torch.isnan(model(ids, labels=labels).loss) and torch.isnan(reference(ids, labels=labels).loss)
    out, grads = step(model, ids, labels=labels, num_items_in_batch=torch.tensor(7))
    assert out.loss.item() == 0.0 == reference(ids, labels=labels, num_items_in_batch=torch.tensor(7)).loss.item()
    assert all(float(g.abs().max()) == 0.0 for g in grads.values())


# ---- the forward without labels, tuples, eval, copies, unpatch ---------------------------------------------

def test_without_labels_the_forward_is_the_models_own():
    model = tiny("gemma2-softcap")
    twin = copy.deepcopy(model)
    integration.patch(model)
    ids, mask, _ = batch()
    assert torch.equal(model(ids, attention_mask=mask).logits, twin(ids, attention_mask=mask).logits)
    loss, *rest = model(ids, labels=ids, return_dict=False)  # a tuple without the logits, as for logits=None
    assert loss.dim() == 0 and not any(isinstance(item, torch.Tensor) and item.shape[-1:] == (0,) for item in rest)
    with torch.no_grad():
        assert model(ids, labels=ids).loss.item() == pytest.approx(fp64_library(twin)(ids, labels=ids).loss.item(),
                                                                   abs=1e-10)


def test_unpatch_restores_the_original_forward_and_a_copy_stays_patched_on_itself():
    model = tiny("qwen3")
    twin = copy.deepcopy(model)
    integration.patch(model)
    duplicate = copy.deepcopy(model)
    assert integration.is_patched(duplicate) and duplicate.forward.__self__ is duplicate
    assert integration.unpatch(model) is model and not integration.is_patched(model)
    assert "forward" not in model.__dict__
    ids, mask, labels = batch()
    out, expected = model(ids, labels=labels), twin(ids, labels=labels)
    assert torch.equal(out.logits, expected.logits) and torch.equal(out.loss, expected.loss)
    with pytest.raises(ValueError, match="is not patched"):
        integration.unpatch(model)
    assert duplicate(ids, labels=labels).logits is None


# ---- logits in evaluation: patch(model, logits=...) ----------------------------------------------------------

def count_head_calls(model) -> list[int]:
    calls = []
    model.lm_head.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


@pytest.mark.parametrize("family", ["llama", "gemma2-softcap", "granite-scaled", "cohere-scaled"])
def test_in_eval_mode_the_logits_are_the_unpatched_models_and_the_loss_and_gradients_lces(family, monkeypatch):
    """fp64: the returned logits are the unpatched model's to the bit (its lm_head and its ops after it), the loss
    and every gradient the library's to 1e-10 (lce's loss, as in training); lm_head's hooks run once."""
    model = tiny(family).eval()
    reference = fp64_library(model)
    integration.patch(model)
    spy = Spy(monkeypatch)
    calls = count_head_calls(model)
    ids, mask, labels = batch(10)
    out, grads = step(model, ids, attention_mask=mask, labels=labels)
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels)
    assert type(out.logits) is torch.Tensor and torch.equal(out.logits, expected.logits)
    assert out.logits.shape == (*ids.shape, VOCAB) and calls == [1] and len(spy.calls) == 1
    assert abs(out.loss.item() - expected.loss.item()) <= 1e-10 * expected.loss.item()
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-10 * expected_grads[name].abs().max(), name
    loss, logits, *_ = model(ids, attention_mask=mask, labels=labels, return_dict=False)  # the tuple keeps them
    assert type(logits) is torch.Tensor and torch.equal(logits, expected.logits)


@pytest.mark.parametrize("family", ["llama", "gemma2-softcap", "granite-scaled", "cohere-scaled"])
def test_in_eval_mode_bf16_and_autocast_logits_are_the_unpatched_models_bit_for_bit(family):
    """The logits are computed in the model's dtype, or autocast's, as the unpatched model computes them, under
    no_grad as the Trainer evaluates; the loss is lce's fp32 value."""
    for dtype, autocast in ((torch.bfloat16, False), (torch.float32, True)):
        library = tiny(family, dtype).eval()
        patched = integration.patch(copy.deepcopy(library))
        ids, mask, labels = batch(11)
        context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
        with torch.no_grad(), context:
            out = patched(ids, attention_mask=mask, labels=labels)
            expected = library(ids, attention_mask=mask, labels=labels)
        assert out.logits.dtype == expected.logits.dtype == torch.bfloat16
        assert torch.equal(out.logits, expected.logits), (dtype, autocast)
        assert out.loss.dtype == torch.float32 and abs(out.loss.item() - expected.loss.item()) <= 1e-2


def test_the_logits_setting_always_returns_them_in_training_and_never_in_neither():
    ids, mask, labels = batch(12)
    model = tiny("llama")
    reference = fp64_library(model)
    always = integration.patch(copy.deepcopy(model), logits="always")
    out, grads = step(always, ids, attention_mask=mask, labels=labels)
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels)
    assert always.training and torch.equal(out.logits, expected.logits) and out.logits.requires_grad
    assert all((g - expected_grads[n]).abs().max() <= 1e-10 for n, g in grads.items())  # the loss's: lce's
    never = integration.patch(copy.deepcopy(model).eval(), logits="never")
    out = never(ids, attention_mask=mask, labels=labels)
    assert out.logits is None and abs(out.loss.item() - expected.loss.item()) <= 1e-10
    default = integration.patch(copy.deepcopy(model))
    assert default(ids, labels=labels).logits is None  # training mode
    assert default.eval()(ids, labels=labels).logits is not None
    assert default.train()(ids, labels=labels).logits is None


# ---- bf16 and autocast: accuracy against fp64 ---------------------------------------------------------------

def errors_against_fp64(model, reference, ids, mask, labels, *, autocast: bool = False, **kwargs):
    """Against ``reference`` (fp64): every gradient's relative Frobenius error (all parameters together, and
    lm_head's), and the loss's absolute error against the fp64 loss of the same final hidden states (the head's
    own error: against the fp64 model, the trunk's rounding of the hidden states dominates the loss's error)."""
    seen = {}
    hook = model.lm_head.register_forward_pre_hook(lambda module, args: seen.update(hidden=args[0]))
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with context:
        out, grads = step(model, ids, attention_mask=mask, labels=labels, **kwargs)
    hook.remove()
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels, **kwargs)
    every = torch.cat([grads[name].double().flatten() for name in expected_grads])
    exact = torch.cat([grad.flatten() for grad in expected_grads.values()])
    head = next(name for name, p in model.named_parameters() if p is model.lm_head.weight)
    with torch.no_grad():
        logits = logit_transform(reference.config, reference.lm_head(seen["hidden"].double()))
        head_loss = library_loss_in_fp64(logits, labels, VOCAB, **kwargs)
    return dict(loss=abs(out.loss.item() - head_loss.item()),
                gradients=float((every - exact).norm() / exact.norm()),
                lm_head=float((grads[head].double() - expected_grads[head]).norm() / expected_grads[head].norm()),
                model_loss=abs(out.loss.item() - expected.loss.item()),
                loss_dtype=out.loss.dtype, grad_dtypes={grad.dtype for grad in grads.values()})


@pytest.mark.parametrize("family", ["llama", "gemma2-softcap", "qwen2-tied"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["mean", "num_items_in_batch"])
def test_bf16_errors_against_fp64_are_no_larger_than_the_librarys(family, accumulate):
    library = tiny(family, torch.bfloat16)
    reference = fp64_library(copy.deepcopy(library).double())
    patched = integration.patch(copy.deepcopy(library))
    ids, mask, labels = batch(4, rows=4, length=32)
    kwargs = dict(num_items_in_batch=3 * (labels[:, 1:] != -100).sum()) if accumulate else {}
    ours = errors_against_fp64(patched, reference, ids, mask, labels, **kwargs)
    theirs = errors_against_fp64(library, reference, ids, mask, labels, **kwargs)
    assert ours["loss_dtype"] == theirs["loss_dtype"] == torch.float32
    for measure in ("loss", "gradients", "lm_head"):
        assert ours[measure] <= theirs[measure], (measure, ours, theirs)


@pytest.mark.parametrize("family", ["llama", "gemma2-softcap"])
def test_under_autocast_the_head_computes_in_bf16_and_the_gradient_reaches_the_fp32_weight(family, monkeypatch):
    library = tiny(family, torch.float32)
    reference = fp64_library(copy.deepcopy(library).double())
    patched = integration.patch(copy.deepcopy(library))
    spy = Spy(monkeypatch)
    ids, mask, labels = batch(5, rows=4, length=32)
    ours = errors_against_fp64(patched, reference, ids, mask, labels, autocast=True)
    theirs = errors_against_fp64(library, reference, ids, mask, labels, autocast=True)
    assert [call["input"].dtype for call in spy.calls] == [torch.bfloat16]
    assert spy.calls[0]["linear_weight"].dtype == torch.bfloat16
    assert ours["loss_dtype"] == torch.float32 and ours["grad_dtypes"] == {torch.float32}
    assert patched.lm_head.weight.grad.abs().max() > 0
    for measure in ("loss", "gradients", "lm_head"):
        assert ours[measure] <= theirs[measure], (measure, ours, theirs)
    patched(ids, labels=labels)  # without autocast: the fp32 model's own dtype
    assert spy.calls[-1]["input"].dtype == torch.float32


def test_the_bf16_loss_is_fp32_not_rounded_to_bf16():
    """The value comes from lce's fp32 log-sum-exp: within 1e-5 of the fp64 loss of the same hidden states and
    head, where a loss rounded to bf16 would be off by up to 2**-6 at 4-8 nats."""
    model = integration.patch(tiny("llama", torch.bfloat16))
    seen = {}
    model.lm_head.register_forward_pre_hook(lambda module, args: seen.update(hidden=args[0]))
    ids, mask, labels = batch(6)
    loss = model(ids, attention_mask=mask, labels=labels).loss
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    logits = seen["hidden"].detach().double().reshape(-1, HIDDEN) @ model.lm_head.weight.detach().double().T
    exact = F.cross_entropy(logits, shifted)
    assert loss.dtype == torch.float32 and abs(loss.item() - exact.item()) <= 1e-5
    assert abs(float(exact.to(torch.bfloat16)) - float(exact)) > 1e-4  # a bf16 loss would have failed above


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_narrow_dtypes_loss_value_is_lces_loss(softcap, with_bias):
    """The fp32 value the integration returns for bf16/fp16 input, from lce's log-sum-exp and the target logits,
    is lce's own loss, z-loss and soft-cap included: in fp64, to the rounding of the fp32 log-sum-exp lce returns
    (a term left out or counted twice would be off by 1e-2 or more)."""
    g = torch.Generator().manual_seed(7)
    x, weight = torch.randn(40, 16, generator=g, dtype=torch.float64), torch.randn(50, 16, generator=g,
                                                                                   dtype=torch.float64)
    bias = torch.randn(50, generator=g, dtype=torch.float64) if with_bias else None
    target = torch.randint(0, 50, (40,), generator=g).masked_fill_(torch.arange(40) % 7 == 0, -100)
    options = lce.LinearCrossEntropyOptions()
    loss, lse = lce.linear_cross_entropy(x, weight, target, linear_bias=bias, options=options, softcap=softcap,
                                         z_loss=1e-2, return_lse=True)
    value = integration._loss_value(x, weight, bias, target, lse, ignore_index=-100, softcap=softcap, z_loss=1e-2)
    assert abs(float(value) - float(loss)) <= 1e-7 * abs(float(loss))


# ---- logit scales (Granite, Cohere), alone and around a soft-cap --------------------------------------------

@pytest.mark.parametrize(("make", "scale"), [
    (lambda: granite(3.0), 1 / 3.0),        # Granite divides: not a power of two
    (lambda: granite(16.0), 1 / 16.0),      # as Granite 3.x's
    (lambda: cohere(0.0625), 0.0625),       # Cohere's default
    (lambda: cohere(0.7), 0.7),
], ids=["granite-3", "granite-16", "cohere-0.0625", "cohere-0.7"])
def test_a_logit_scale_is_lces_input_scaled_with_the_librarys_loss_and_gradients(make, scale, monkeypatch):
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model = model.double().train()
    reference = fp64_library(model)
    integration.patch(model)
    spy = Spy(monkeypatch)
    seen = {}
    model.lm_head.register_forward_pre_hook(lambda module, args: seen.update(hidden=args[0]))
    ids, mask, labels = batch(13)
    out, grads = step(model, ids, attention_mask=mask, labels=labels)
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels)
    assert abs(out.loss.item() - expected.loss.item()) <= 1e-10 * expected.loss.item()
    assert grads.keys() == expected_grads.keys() and len(grads) > 5
    for name, grad in grads.items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-10 * expected_grads[name].abs().max(), name
    (call,) = spy.calls
    hidden = seen["hidden"].reshape(-1, HIDDEN).detach()
    assert call["softcap"] is None and call["linear_weight"] is model.lm_head.weight
    assert torch.allclose(call["input"], hidden * scale, rtol=2 ** -52, atol=0)


@pytest.mark.parametrize("family", ["granite-scaled", "cohere-scaled"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["mean", "num_items_in_batch"])
def test_a_power_of_two_scale_is_exact_in_bf16_and_another_costs_one_rounding_of_the_hidden_states(family, accumulate,
                                                                                                  monkeypatch):
    """bf16: Granite's 1/8 scales the hidden states exactly, and the loss's error is the fp32 statistics' (below
    1e-5, where the library's rounded logits are off by 1e-4); Cohere's 0.3 rounds them once (to nearest), and the
    loss is the fp64 loss of those rounded, scaled states to 1e-5. Either way every gradient is within a few bf16
    rounding floors of fp64's and within 1.25 times the library's error, all parameters together (the trunk's
    rounding dominates both, and which is smaller is luck at the 1% level) and lm_head's alone."""
    library = tiny(family, torch.bfloat16)
    reference = fp64_library(copy.deepcopy(library).double())
    patched = integration.patch(copy.deepcopy(library))
    seen = {}
    patched.lm_head.register_forward_pre_hook(lambda module, args: seen.update(hidden=args[0]))
    spy = Spy(monkeypatch)
    ids, mask, labels = batch(4, rows=4, length=32)
    kwargs = dict(num_items_in_batch=3 * (labels[:, 1:] != -100).sum()) if accumulate else {}
    ours = errors_against_fp64(patched, reference, ids, mask, labels, **kwargs)
    theirs = errors_against_fp64(library, reference, ids, mask, labels, **kwargs)
    x = spy.calls[0]["input"].detach()
    exact = seen["hidden"].detach().reshape(-1, HIDDEN).double() * (1 / GRANITE_SCALING if "granite" in family
                                                                    else COHERE_SCALE)
    assert x.dtype == torch.bfloat16
    if family.startswith("granite"):  # a power of two
        assert torch.equal(x.double(), exact)
        assert ours["loss"] <= 1e-5 and ours["loss"] <= theirs["loss"] / 10, (ours, theirs)
    else:
        assert not torch.equal(x.double(), exact)
        assert ((x.double() - exact).abs() <= 2 ** -8 * exact.abs()).all()  # one rounding to nearest (u = 2**-8)
        with torch.no_grad():
            loss = patched(ids, attention_mask=mask, labels=labels, **kwargs).loss.item()
            logits = x.double() @ patched.lm_head.weight.double().T
            of_lce_input = library_loss_in_fp64(logits.reshape(*ids.shape, VOCAB), labels, VOCAB, **kwargs).item()
        assert abs(loss - of_lce_input) <= 1e-5
    _, exact_grads = step(reference, ids, attention_mask=mask, labels=labels, **kwargs)
    every = torch.cat([grad.flatten() for grad in exact_grads.values()])
    floor = float((every.to(torch.bfloat16).double() - every).norm() / every.norm())
    assert ours["gradients"] <= 4 * floor and ours["gradients"] <= 1.25 * theirs["gradients"], (ours, theirs)
    assert ours["lm_head"] <= 1.25 * theirs["lm_head"], (ours, theirs)


class CappedLlamaForCausalLM(transformers.LlamaForCausalLM):
    """A Llama whose forward scales its logits before a soft-cap and after it (no transformers model does both):
    ``0.5 * (3 * tanh(0.75 * z / 3)) / 0.8``, which is ``C * tanh(S * z / C)`` with ``S = 0.75 * 0.625`` and
    ``C = 3 * 0.625``."""

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.lm_head(hidden) * 0.75
        logits = 3.0 * torch.tanh(logits / 3.0)
        logits = 0.5 * logits / 0.8
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        return transformers.modeling_outputs.CausalLMOutputWithPast(loss=loss, logits=logits)


def test_scales_before_and_after_a_soft_cap_compose_into_one_scale_and_one_cap(monkeypatch):
    torch.manual_seed(0)
    model = CappedLlamaForCausalLM(transformers.LlamaConfig(**_COMMON, tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model = model.double().train()
    reference = fp64_library(model)
    integration.patch(model)
    spy = Spy(monkeypatch)
    ids, mask, labels = batch(14)
    out, grads = step(model, ids, attention_mask=mask, labels=labels)
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels)
    assert spy.calls[0]["softcap"] == 3 * 0.625
    assert abs(out.loss.item() - expected.loss.item()) <= 1e-10 * expected.loss.item()
    for name, grad in grads.items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-10 * expected_grads[name].abs().max(), name
    with torch.no_grad():
        assert torch.equal(model.eval()(ids, labels=labels).logits, reference.eval()(ids, labels=labels).logits)


def _stand_in():
    return integration._DeferredLogits(torch.empty(2, 3, 0, dtype=torch.bfloat16), "Tiny")


@pytest.mark.parametrize(("transform", "scale", "cap"), [
    (lambda z: z / 16, Fraction(1, 16), None),
    (lambda z: 0.0625 * z, Fraction(1, 16), None),
    (lambda z: z.float() * torch.tensor(0.25), Fraction(1, 4), None),  # a cast and a 0-dim tensor
    (lambda z: torch.div(z, 3.0), Fraction(1, 3), None),
    (lambda z: torch.tanh(z / 30.0) * 30.0, Fraction(1), Fraction(30)),  # Gemma's: / cap and * cap cancel exactly
    (lambda z: torch.tanh(z / 49.0).mul_(49.0), Fraction(1), Fraction(49)),  # 49 * (1 / 49) != 1 in floats
    (lambda z: 2 * torch.tanh(z * 0.5 / 3) * 3 / 4, Fraction(1, 4), Fraction(3, 2)),  # 1.5 tanh(z / 6)
    (lambda z: -2.0 * z.tanh(), Fraction(-2), Fraction(2)),  # -2 tanh(z) = 2 tanh(-2 z / 2)
])
def test_recorded_scales_and_a_tanh_are_identified_as_one_scale_and_one_cap(transform, scale, cap):
    assert integration._scale_and_cap(transform(_stand_in()).ops) == (scale, cap)


@pytest.mark.parametrize(("transform", "message"), [
    (lambda z: z.tanh().tanh(), "a second tanh"),
    (lambda z: z * 0.0, "multiplied by 0"),
    (lambda z: z / 0, "divided by 0"),
    (lambda z: z * torch.nn.Parameter(torch.tensor(2.0)), "requires grad"),
    (lambda z: z * 1e300 * 1e300, "out of float range"),
])
def test_what_is_not_one_scale_and_one_cap_is_refused_with_the_reason(transform, message):
    with pytest.raises(integration._Unmappable, match=message):
        integration._scale_and_cap(transform(_stand_in()).ops)


# ---- options and lce keywords -------------------------------------------------------------------------------

def test_options_recommend_asks_lce_recommend_for_the_batch_shape(monkeypatch):
    spy = Spy(monkeypatch)
    ids, mask, labels = batch()
    integration.patch(tiny("llama", torch.float32), options="recommend")(ids, labels=labels)
    expected = lce.recommend(ids.numel(), HIDDEN, VOCAB, torch.float32, "cpu").options
    assert spy.calls[-1]["options"] == expected
    explicit = lce.LinearCrossEntropyOptions(acc_policy="accurate", batch_chunk_size=5)
    integration.patch(tiny("llama", torch.float32), options=explicit)(ids, labels=labels)
    assert spy.calls[-1]["options"] is explicit


def test_a_memory_budget_chunks_the_head_and_keeps_the_librarys_loss(monkeypatch):
    model = tiny("gemma2-softcap")
    reference = fp64_library(model)
    spy = Spy(monkeypatch)
    ids, mask, labels = batch()
    budget = int(1.05 * (ids.numel() + VOCAB) * HIDDEN * 8)  # just above the fp64 gradients' own bytes
    integration.patch(model, options=integration.Recommended(memory_budget=budget))
    out, grads = step(model, ids, attention_mask=mask, labels=labels)
    expected, expected_grads = step(reference, ids, attention_mask=mask, labels=labels)
    options = spy.calls[-1]["options"]  # the budget forces chunking: rows, classes or both
    assert options.batch_chunk_size < ids.numel() or options.class_chunk_size is not None
    assert abs(out.loss.item() - expected.loss.item()) <= 1e-10
    assert all((g - expected_grads[n]).abs().max() <= 1e-10 for n, g in grads.items())


def test_z_loss_adds_lces_term_to_the_models_loss():
    model = tiny("llama")
    reference = fp64_library(model)
    integration.patch(model, z_loss=1e-3)
    ids, mask, labels = batch()
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    lse = reference(ids, attention_mask=mask).logits.reshape(-1, VOCAB).logsumexp(-1)[shifted != -100]
    expected = reference(ids, attention_mask=mask, labels=labels).loss.item() + 1e-3 * lse.square().mean().item()
    assert abs(model(ids, attention_mask=mask, labels=labels).loss.item() - expected) <= 1e-10


# ---- bad use -------------------------------------------------------------------------------------------------

def _tiny_other(name: str):
    torch.manual_seed(0)
    if name == "LlamaForSequenceClassification":
        return transformers.LlamaForSequenceClassification(transformers.LlamaConfig(**_COMMON, num_labels=3))
    if name == "BartForConditionalGeneration":
        return transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64))
    if name == "RobertaForMaskedLM":
        return transformers.RobertaForMaskedLM(transformers.RobertaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64))
    raise KeyError(name)


@pytest.mark.parametrize(("name", "error", "message"), [
    ("LlamaForSequenceClassification", ValueError, "LlamaForSequenceClassification has no lm_head"),
    ("BartForConditionalGeneration", ValueError, "BartForConditionalGeneration is an encoder-decoder model"),
    ("RobertaForMaskedLM", TypeError, "RobertaForMaskedLM.lm_head must be a torch.nn.Linear, got RobertaLMHead"),
])
def test_models_that_are_not_decoder_only_causal_lms_are_refused_by_name(name, error, message):
    with pytest.raises(error, match=message):
        integration.patch(_tiny_other(name))


def test_a_module_that_is_not_a_transformers_model_is_refused():
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel .*got Linear"):
        integration.patch(torch.nn.Linear(2, 3))


@pytest.mark.parametrize(("transform", "message"), [
    (lambda logits: logits + 1.0, r"add to the logits after lm_head.*, and this is not 1.0 \* z"),
    (lambda logits: logits.clamp(-5.0, 5.0) * 0.5, r"clamp, mul to the logits.*, and this is not 0.5 \* z"),
    (lambda logits: torch.tanh(torch.tanh(logits)), "a second tanh"),
    (lambda logits: logits * 0, "the logits are multiplied by 0"),
])
def test_a_transform_of_the_logits_lce_cannot_map_is_refused_at_the_call(transform, message):
    """A forward hook on lm_head stands for a model's own code after it: it runs on the logits' stand-in."""
    model = tiny("llama")
    model.lm_head.register_forward_hook(lambda module, args, output: transform(output))
    integration.patch(model)
    ids, _, labels = batch()
    with pytest.raises(ValueError, match=r"LlamaForCausalLM's forward applies .*" + message):
        model(ids, labels=labels)
    assert model(ids).logits.shape == (*ids.shape, VOCAB)  # without labels the model's own forward runs


@pytest.mark.parametrize(("options", "keywords", "error", "message"), [
    (3, {}, TypeError, "options must be None, 'recommend', a LinearCrossEntropyOptions .* got int"),
    ("fast", {}, ValueError, "options must be None, 'recommend'.* got the string 'fast'"),
    (None, {"softcap": 30.0}, ValueError, r"passes only \('z_loss',\).*softcap comes from the model's config"),
    (None, {"reduction": "sum"}, ValueError, "reduction comes from the model's loss"),
    (None, {"z_loss": -1.0}, ValueError, "z_loss must be a finite float >= 0, got -1.0"),
    (None, {"z_loss": "1e-4"}, TypeError, "z_loss must be a float >= 0, got str"),
    (None, {"logits": "train"}, ValueError, "logits must be one of 'eval', 'always', 'never', got 'train'"),
    (None, {"logits": True}, ValueError, "logits must be one of 'eval', 'always', 'never', got True"),
])
def test_bad_options_and_keywords_are_refused_by_name(options, keywords, error, message):
    model = tiny("llama")
    with pytest.raises(error, match=message):
        integration.patch(model, options, **keywords)
    assert not integration.is_patched(model)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(memory_budget=-1), "Recommended.memory_budget must be a positive int"),
    (dict(memory_budget=1.5e9), "Recommended.memory_budget must be a positive int .* got 1500000000.0"),
    (dict(max_error=0.5), "Recommended.max_error must be a number of floors >= 1"),
])
def test_bad_recommendation_settings_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        integration.Recommended(**fields)


def test_patching_twice_is_refused():
    model = integration.patch(tiny("llama"))
    with pytest.raises(ValueError, match="this LlamaForCausalLM is patched already"):
        integration.patch(model)


def test_torchs_options_are_accepted():
    torch_options = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    if torch_options is None:
        pytest.skip("torch has no nn.LinearCrossEntropyOptions (added in 2.13)")
    model = integration.patch(tiny("llama"), torch_options(acc_policy="accurate"))
    assert model.__dict__["_lce_patch"].options == lce.LinearCrossEntropyOptions(acc_policy="accurate")


# ---- the Trainer ---------------------------------------------------------------------------------------------

def _dataset(rows: int = 8, length: int = 16) -> list[dict[str, torch.Tensor]]:
    """Examples with prompts of different lengths masked with -100, so the micro-batches' label counts differ."""
    g = torch.Generator().manual_seed(9)
    examples = []
    for row in range(rows):
        ids = torch.randint(0, VOCAB, (length,), generator=g)
        labels = ids.clone()
        labels[: 2 + row % 5] = -100
        examples.append(dict(input_ids=ids, attention_mask=torch.ones(length, dtype=torch.int64), labels=labels))
    return examples


def _train(model, folder, *, bf16: bool):
    arguments = transformers.TrainingArguments(
        output_dir=str(folder), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=2,
        learning_rate=0.05, optim="sgd", lr_scheduler_type="constant", logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, seed=0, bf16=bf16, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=_dataset(),
                                   data_collator=transformers.default_data_collator)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses, {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_trainer_with_gradient_accumulation_trains_as_the_unpatched_model(bf16, tmp_path, monkeypatch):
    """Two optimizer steps of two micro-batches each (SGD, so parameters differ by the gradients' differences):
    the Trainer passes num_items_in_batch (the window's labelled tokens) to every micro-batch; with fp32
    parameters and bf16=True (autocast) the loss it logs is fp32 and the parameters stay fp32."""
    seen = []
    real = integration._lce_loss
    monkeypatch.setattr(integration, "_lce_loss", lambda *a, **k: seen.append(k["num_items_in_batch"]) or real(*a, **k))
    library = tiny("llama", torch.float32)
    start = {name: p.detach().clone() for name, p in library.named_parameters()}
    patched = integration.patch(copy.deepcopy(library))
    trainer, losses, params = _train(patched, tmp_path / "lce", bf16=bf16)
    _, expected_losses, expected = _train(library, tmp_path / "library", bf16=bf16)
    assert trainer.model_accepts_loss_kwargs
    # the two steps' windows hold the 8 examples once: each window's count reaches both of its micro-batches
    counts = [int(n) for n in seen]
    assert len(counts) == 4 and counts[0] == counts[1] and counts[2] == counts[3]
    assert counts[0] + counts[2] == sum(int((e["labels"][1:] != -100).sum()) for e in _dataset())
    # fp32: both heads round to fp32; bf16: lce's head runs fp32 GEMMs where the library's rounds its logits to bf16
    loss_tolerance, step_tolerance = (2e-3, 0.03) if bf16 else (1e-6, 1e-4)
    assert losses == pytest.approx(expected_losses, rel=loss_tolerance) and len(losses) == 2
    for name, value in params.items():
        assert value.dtype == torch.float32 and not torch.equal(value, start[name]), name
        moved = (expected[name] - start[name]).norm()
        assert (value - expected[name]).norm() <= step_tolerance * moved, name


def _evaluate(model, folder) -> tuple[dict[str, float], list]:
    """``Trainer.evaluate`` on four rows, two per batch; ``compute_metrics`` keeps the predictions it receives and
    reports the next-token accuracy of their argmax on the labelled positions."""
    received = []

    def compute_metrics(prediction):
        received.append(prediction.predictions)
        predicted = torch.from_numpy(prediction.predictions).argmax(-1)[:, :-1]
        labels = torch.from_numpy(prediction.label_ids)[:, 1:]
        return {"accuracy": float((predicted == labels)[labels != -100].double().mean())}

    arguments = transformers.TrainingArguments(
        output_dir=str(folder), per_device_eval_batch_size=2, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=arguments, eval_dataset=_dataset(rows=4),
                                   data_collator=transformers.default_data_collator, compute_metrics=compute_metrics)
    return trainer.evaluate(), received


def test_trainer_evaluate_gives_compute_metrics_the_unpatched_models_logits(tmp_path):
    """``Trainer.evaluate`` (which puts the model in eval mode) reports the patched model's eval loss (lce's, the
    library's in fp32 to 1e-6) and gives ``compute_metrics`` its logits, equal to the unpatched model's; back in
    training mode it forms none."""
    library = tiny("llama", torch.float32)
    patched = integration.patch(copy.deepcopy(library))
    ours, received = _evaluate(patched, tmp_path / "lce")
    theirs, expected = _evaluate(library, tmp_path / "library")
    assert len(received) == len(expected) == 1 and received[0].shape == (4, 16, VOCAB)
    assert (received[0] == expected[0]).all()
    assert ours["eval_accuracy"] == theirs["eval_accuracy"]
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=1e-6)
    ids = torch.stack([example["input_ids"] for example in _dataset(rows=2)])
    assert patched.train()(ids, labels=ids).logits is None


@pytest.mark.slow
def test_import_lce_and_the_integration_leave_transformers_unimported():
    assert_import_leaves_out("lce.integrations.transformers", ["transformers", "accelerate"])


@pytest.mark.slow
def test_the_fine_tuning_example_trains_both_models_on_the_repos_corpus(tmp_path):
    """examples/hf_finetune.py, a few steps on a slice of the corpus: in fp32 the two curves start together."""
    import csv
    import subprocess
    import sys

    from analysis.paths import ROOT

    curves = tmp_path / "curves.csv"
    done = subprocess.run([sys.executable, "examples/hf_finetune.py", "--steps", "4", "--every", "2", "--batch", "2",
                           "--corpus-mb", "0.5", "--vocab", "1024", "--csv", str(curves)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the curves agreed to 1e-4 nats up to step 4" in done.stdout
    with open(curves, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["step"], row["split"]) for row in rows] == [("2", "train"), ("2", "heldout"), ("4", "train"),
                                                             ("4", "heldout")]


# ---- fp16 autocast with a loss scale (lce.passes.headroom)
# -------------------------------------------------------------

def _scaled_head_gradient(model, ids, mask, labels, scale: float) -> torch.Tensor:
    """lm_head's weight gradient after one fp16-autocast step whose loss is multiplied by ``scale`` (as
    torch.amp.GradScaler does), divided by the scale again."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(ids, attention_mask=mask, labels=labels)
    (out.loss.float() * scale).backward()
    return model.lm_head.weight.grad.double() / scale


@pytest.mark.parametrize("scale", [2.0 ** 12, 2.0 ** 16])
def test_under_fp16_autocast_a_loss_scale_reaches_lces_gradients_as_it_reaches_the_unpatched_heads(scale):
    ids, mask, labels = batch()
    unpatched = tiny("llama", torch.float32)
    patched = integration.patch(copy.deepcopy(unpatched))
    reference = tiny("llama", torch.float64)
    _, exact = step(reference, ids, attention_mask=mask, labels=labels)
    head = next(name for name, p in reference.named_parameters() if p is reference.lm_head.weight)
    truth = exact[head]
    theirs = _scaled_head_gradient(unpatched, ids, mask, labels, scale)
    mine = _scaled_head_gradient(patched, ids, mask, labels, scale)
    assert torch.isfinite(mine).all()
    error = float((mine - truth).norm() / truth.norm())
    assert error <= 1.1 * float((theirs - truth).norm() / truth.norm()) + 1e-4, error
