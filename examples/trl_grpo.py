"""lce inside TRL: a ``GRPOTrainer`` step with its fused LM head routed through lce, and the importance-ratio error
of four heads on that step's batch.

    python examples/trl_grpo.py [--vocab 16384] [--temperatures 1.0 0.7]

For each temperature: a tiny Qwen2 (2 layers, its head scaled so that the logits spread over ``--spread`` nats,
as a trained head's do), a word-level tokenizer built here (no download), and a ``GRPOTrainer`` with
``bf16=True`` (fp32 parameters under bf16 autocast) and a KL penalty (so a reference model too), routed with
``lce.integrations.trl.route(trainer)``, trains one step. On the batch that step trained on, the per-token
log-probabilities of the sampled tokens come from four heads, each through the model's own
``model(..., labels=..., fused_lm_head=True)`` call under bf16 autocast, as the trainer computes them:

* ``trl``: TRL's default fused head (bf16 logits tiles, fp32 statistics);
* ``trl cast_lm_head_to_fp32``: TRL's head with fp32 GEMMs, outside autocast;
* ``lce``: TRL's call routed through ``lce.linear_log_probs`` with lce's default options (on a CPU, the
  ``accurate`` policy: fp32 GEMMs on the bf16 operands);
* ``lce balanced``: the same with the ``balanced`` policy and fp32 accumulation, lce's default on CUDA (bf16 GEMMs
  with fp32 results; on a CPU without native bf16 GEMMs lce runs them on fp32 copies, one rounding);

and each is compared with fp64 on the same operands: the head's weight and the final hidden states are rounded to
bf16 values first (in their fp32 tensors), so every head and the fp64 reference see the same numbers and the
error is the head's own. The error printed is the worst ``|exp(log p - log p_fp64) - 1|`` over the completion
tokens: the importance ratio's error at a ratio of 1.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built here; nothing is downloaded

import torch  # noqa: E402

import lce  # noqa: E402

HEADS = ("trl", "trl cast_lm_head_to_fp32", "lce", "lce balanced")
"""TRL's default head, TRL's fp32 head, lce routed with its default options (on a CPU: the accurate policy, fp32
GEMMs), lce routed with the balanced policy and fp32 results (lce's default on CUDA: bf16 GEMMs into fp32)."""
VOCAB, HIDDEN, SPREAD = 16384, 64, 3.0
BALANCED = lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32)
PROMPTS, GENERATIONS, PROMPT_WORDS, COMPLETION = 2, 4, 6, 16
SPECIAL = ("<pad>", "<eos>", "<unk>")


def word_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` entries, built here: ``<pad>``, ``<eos>``, ``<unk>``, then ``w3`` to
    ``w{vocab - 1}``, words split on whitespace."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {token: index for index, token in enumerate(SPECIAL)}
    words.update({f"w{index}": index for index in range(len(SPECIAL), vocab)})
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def tiny_qwen2(folder: Path, *, vocab: int = VOCAB, hidden: int = HIDDEN, spread: float | None = SPREAD,
               dtype: torch.dtype = torch.float32, seed: int = 0):
    """A random-init Qwen2ForCausalLM (2 layers, untied head), saved in ``folder`` (TRL builds a reference model
    from the policy's ``_name_or_path``). With ``spread``, its head is scaled so that the logits of random tokens'
    final hidden states have that standard deviation over the vocabulary (nats), as a trained head's have a few."""
    import transformers

    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config)
    if spread is not None:
        with torch.no_grad():
            ids = torch.randint(len(SPECIAL), vocab, (4, 16), generator=torch.Generator().manual_seed(seed))
            logits = model(ids).logits
            model.lm_head.weight.mul_(spread / float(logits.std(-1).mean()))
    model = model.to(dtype)
    model.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    return model


def prompts(count: int = PROMPTS, words: int = PROMPT_WORDS, vocab: int = VOCAB, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), vocab, (count, words), generator=g)
    return [" ".join(f"w{int(i)}" for i in row) for row in ids]


def even_words(completions, **_) -> list[float]:
    """A toy reward that differs between completions: the fraction of their words with an even index."""
    def share(text: str) -> float:
        words = text.split()
        return sum(int(word[1:]) % 2 == 0 for word in words if word[1:].isdigit()) / max(len(words), 1)

    return [share(text) for text in completions]


def grpo_trainer(model, tokenizer, folder: Path, *, temperature: float, bf16: bool, beta: float = 0.04,
                 learning_rate: float = 1e-3, count: int = PROMPTS, completion: int = COMPLETION, **arguments):
    """A ``GRPOTrainer`` on the CPU: ``count`` prompts a step, ``GENERATIONS`` completions of up to ``completion``
    tokens each, sampled at ``temperature``; ``bf16``: fp32 parameters under bf16 autocast."""
    import trl
    from datasets import Dataset

    args = trl.GRPOConfig(output_dir=str(folder / "run"), per_device_train_batch_size=count * GENERATIONS,
                          num_generations=GENERATIONS, max_completion_length=completion, temperature=temperature,
                          beta=beta, learning_rate=learning_rate, max_steps=1, use_cpu=True, bf16=bf16, seed=0,
                          report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True, **arguments)
    data = Dataset.from_dict({"prompt": prompts(count, vocab=model.config.vocab_size)})
    return trl.GRPOTrainer(model=model, reward_funcs=even_words, args=args, train_dataset=data,
                           processing_class=tokenizer)


def record_batches(trainer) -> list[dict]:
    """The inputs of every loss the trainer computes from now on (prompt and completion ids and masks,
    advantages, reference log-probabilities), appended to the list returned."""
    seen: list[dict] = []
    compute = trainer._compute_loss

    def recording(model, inputs):
        seen.append({key: value.detach().clone() if torch.is_tensor(value) else value for key, value in inputs.items()})
        return compute(model, inputs)

    trainer._compute_loss = recording
    return seen


def sequences(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)`` of a recorded batch, the labels as GRPOTrainer scores them: the
    completion tokens, -100 elsewhere (the prompt and the padding)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :batch["prompt_ids"].shape[1]] = -100
    return ids, mask, labels


def round_to_bf16_(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.copy_(tensor.to(torch.bfloat16))


class RoundedHidden:
    """A forward hook on the final norm that rounds its output to bf16 values (kept in its fp32 tensor), so that every
    head computes from the same numbers, and keeps the last such output."""

    def __init__(self):
        self.last: torch.Tensor | None = None

    def __call__(self, module, args, out: torch.Tensor) -> torch.Tensor:
        self.last = round_to_bf16_(out.detach().clone())
        return self.last


def head_ratio_error(policy, batch: dict, head: str, *, temperature: float) -> float:
    """The worst ``|exp(log p - log p_fp64) - 1|`` over ``batch``'s completion tokens of one of :data:`HEADS`, on a
    copy of ``policy`` whose head weight and final hidden states are rounded to bf16 values, under bf16 autocast
    (the trainer's ``accelerator.autocast()`` with ``bf16=True`` on a CPU)."""
    from trl.trainer.utils import add_fused_lm_head

    from lce.integrations import trl as route_trl

    model = type(policy)(policy.config)
    model.load_state_dict(policy.state_dict())
    model.eval()
    with torch.no_grad():
        round_to_bf16_(model.lm_head.weight)
    hidden = RoundedHidden()
    model.model.norm.register_forward_hook(hidden)
    add_fused_lm_head(model, temperature=temperature, cast_lm_head_to_fp32=head == "trl cast_lm_head_to_fp32",
                      outputs=("log_probs", "entropy"))
    if head.startswith("lce"):
        route_trl.route(model, options=BALANCED if head == "lce balanced" else None)
    ids, mask, labels = sequences(batch)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            log_probs = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs
    finally:
        if route_trl.is_routed(model):
            route_trl.unroute(model)
    target = labels[:, 1:]
    logits = hidden.last[:, :-1].double() @ model.lm_head.weight.detach().double().T / temperature
    exact = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    return float((log_probs.double() - exact)[target != -100].exp().sub(1).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--spread", type=float, default=SPREAD, help="the logits' standard deviation (nats)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    options = parser.parse_args()

    import datasets
    import transformers
    import trl

    from analysis.core.provenance import cpu_model
    from lce.integrations import trl as route_trl

    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()

    print(f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{cpu_model()}; Qwen2, 2 layers x {options.hidden}, vocabulary "
          f"{options.vocab}, logits spread {options.spread} nats, bf16=True (fp32 parameters, bf16 autocast)")
    print(f"{'T':>4}  {'tokens':>6}  " + "  ".join(f"{head:>24}" for head in HEADS))
    for temperature in options.temperatures:
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            model = tiny_qwen2(folder / "model", vocab=options.vocab, hidden=options.hidden, spread=options.spread)
            trainer = grpo_trainer(model, word_tokenizer(options.vocab), folder, temperature=temperature, bf16=True)
            trainer.remove_callback(transformers.PrinterCallback)
            route_trl.route(trainer)
            batches = record_batches(trainer)
            trainer.train()
            route_trl.unroute(trainer)
            batch = batches[-1]
            errors = {head: head_ratio_error(trainer.model, batch, head, temperature=temperature) for head in HEADS}
        tokens = int(batch["completion_mask"].sum())
        print(f"{temperature:>4}  {tokens:>6}  " + "  ".join(f"{errors[head]:>24.2e}" for head in HEADS))


if __name__ == "__main__":
    main()
