"""Input families: what ``(x, W, b, y)`` each draws, and why.

Every family returns fp32 CPU tensors drawn from a seeded generator (the same
seed gives the same values on every machine); :func:`analysis.core.inputs.make_inputs`
rounds them once to the run's dtype. A family is named by a string, with an
optional parameter after a colon (``"calibrated:0.5"``):

* ``random`` -- x ~ N(0, 1), W ~ N(0, 9/D) (logits of standard deviation 3),
  b ~ N(0, 1), targets uniform over the classes. A head that is confidently
  wrong on every row: mean loss 11-14 nats, p_target around 1e-6. Kept because
  every verdict before the realistic families rests on it.
* ``calibrated[:LOSS]`` -- a synthetic head with the traits of a trained one,
  each a knob (:class:`Calibration`) with its reason. Its mean loss is set to
  ``LOSS`` nats (default 3, the range of trained LM heads; 0.5 for a sharp head,
  6 for an early one).
* ``trained[:CHECKPOINT]`` -- hidden states, head weight and next-token targets
  of the small language model trained in this repo on the CPython standard
  library (:mod:`analysis.lm`), at checkpoint ``final`` (default) or ``early``.
  Its shape is the model's: D and C must match the dump, N at most its rows.
  Seed 0 takes the first N rows; another seed takes N rows drawn without
  replacement by that seed (in dump order), so seeds are distinct samples of
  the model's tokens whenever N is below the dump's rows. The model's head has no bias: with ``bias=True``
  the family supplies a zero bias, so the bias gradient is still measured.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from analysis.core.problem import Shape

__all__ = ["Draw", "Calibration", "CALIBRATION", "FAMILIES", "parse_family", "draw", "family_kind", "confident_rows"]

FAMILIES: tuple[str, ...] = ("random", "calibrated", "trained")
"""The family kinds; a family name is a kind, optionally ``:parameter``."""


@dataclasses.dataclass
class Draw:
    """One family's fp32 tensors: input (N, D), weight (C, D), bias (C,) or None, target (N,) int64."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    target: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The knobs of the ``calibrated`` family, each with the trait of trained heads it reproduces.

    ``zipf_exponent``: token frequencies in text follow Zipf's law with an
    exponent near 1; the class prior ``p_c ~ rank_c ** -s`` (ranks a random
    permutation of the classes) enters as the bias ``log p_c``, so frequent
    classes get large logits on every row and rare classes' weight-gradient
    rows are tiny.
    ``mean_loss``: targets are sampled from the model's own softmax, so the
    expected loss is the model's entropy; the logit scale is solved for (on a
    sample of rows) so that the mean loss over all rows is about this many
    nats (the confident rows' loss is near 0, so the others get
    ``mean_loss / (1 - confident_share)``).
    ``outlier_dims`` / ``outlier_scale``: LLM hidden states carry a few feature
    dimensions tens of times larger than the rest ("outlier features",
    "massive activations"); they dominate every dot product's partial sums.
    ``confident_share`` / ``confident_margin``: a share of rows is predicted
    with near certainty (p_target -> 1: code keywords, closing brackets, the
    second half of a word): the row's top class becomes its target and its
    logit is raised by a margin drawn uniformly from this range (nats).
    Without a bias (``bias=False``) the prior rides on feature 0, set to 1 on
    every row, as trained models carry a near-constant massive activation.
    """

    zipf_exponent: float = 1.1
    mean_loss: float = 3.0
    outlier_dims: int = 4
    outlier_scale: float = 20.0
    confident_share: float = 0.1
    confident_margin: tuple[float, float] = (10.0, 30.0)
    calibration_rows: int = 256


CALIBRATION = Calibration()
"""The defaults of the ``calibrated`` family."""


def parse_family(name: str) -> tuple[str, str]:
    """``"calibrated:0.5"`` -> ``("calibrated", "0.5")``; ``ValueError`` naming the known kinds otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"family must be a str, got {type(name).__name__}")
    kind, _, parameter = name.partition(":")
    if kind not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)} (optionally ':parameter'), got {name!r}")
    if kind == "random" and parameter:
        raise ValueError(f"the random family takes no parameter, got {name!r}")
    if kind == "calibrated" and parameter:
        try:
            loss = float(parameter)
        except ValueError:
            loss = math.nan
        if not 0 < loss < 20:
            raise ValueError(f"calibrated:LOSS needs a mean loss in nats in (0, 20), got {name!r}")
    return kind, parameter


def family_kind(name: str) -> str:
    """The kind of a family name: ``"calibrated:0.5"`` -> ``"calibrated"``."""
    return parse_family(name)[0]


def draw(family: str, shape: Shape, *, seed: int = 0, bias: bool = True) -> Draw:
    """The fp32 tensors of ``family`` at ``shape`` (see the module docstring)."""
    kind, parameter = parse_family(family)
    generator = torch.Generator().manual_seed(seed)
    if kind == "random":
        return _random(shape, generator, bias)
    if kind == "calibrated":
        knobs = CALIBRATION if not parameter else dataclasses.replace(CALIBRATION, mean_loss=float(parameter))
        return _calibrated(shape, generator, bias, knobs)
    return _trained(shape, parameter or "final", bias, generator if seed else None)


RANDOM_LOGIT_SCALE = 3.0
"""The ``random`` family's logit standard deviation: W ~ N(0, RANDOM_LOGIT_SCALE**2 / D)."""


def _random(shape: Shape, generator: torch.Generator, bias: bool) -> Draw:
    x = torch.randn(shape.N, shape.D, generator=generator)
    w = torch.randn(shape.C, shape.D, generator=generator) * (RANDOM_LOGIT_SCALE / shape.D**0.5)
    b = torch.randn(shape.C, generator=generator) if bias else None
    y = torch.randint(0, shape.C, (shape.N,), generator=generator)
    return Draw(x, w, b, y)


def _mean_entropy(scores: torch.Tensor, prior: torch.Tensor, scale: float) -> float:
    logp = torch.log_softmax(scores * scale + prior, dim=1)
    return float(-(logp.exp() * logp).sum(1).mean())


def _bisect(function, target: float, low: float, high: float) -> float:
    """The x in [low, high] where the decreasing ``function`` crosses ``target`` (40 halvings)."""
    for _ in range(40):
        middle = (low + high) / 2
        if function(middle) > target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _solve_scale(scores: torch.Tensor, prior: torch.Tensor, mean_loss: float) -> tuple[float, float]:
    """``(scale, prior_strength)`` whose softmax of ``scores * scale + prior * prior_strength`` has ``mean_loss``
    nats of mean entropy on these rows.

    Entropy falls as the scale grows, from the prior's entropy at 0. A target
    above the prior's own entropy is reached by flattening the prior first
    (a strength below 1, leaving half a nat for the scores to take away).
    """
    strength = 1.0
    if _mean_entropy(scores, prior, 0.0) < mean_loss + 0.5:
        strength = _bisect(lambda a: _mean_entropy(scores, prior * a, 0.0), mean_loss + 0.5, 0.0, 1.0)
    prior = prior * strength
    high = 1.0
    while _mean_entropy(scores, prior, high) > mean_loss and high < 1e4:
        high *= 2
    return _bisect(lambda b: _mean_entropy(scores, prior, b), mean_loss, 0.0, high), strength


def _calibrated(shape: Shape, generator: torch.Generator, bias: bool, knobs: Calibration) -> Draw:
    n, d, c = shape.N, shape.D, shape.C
    x = torch.randn(n, d, generator=generator)
    outliers = torch.randperm(d, generator=generator)[:min(knobs.outlier_dims, max(d - 1, 0))]
    w = torch.randn(c, d, generator=generator) / d**0.5
    ranks = torch.randperm(c, generator=generator).double() + 1
    log_prior = -knobs.zipf_exponent * ranks.log()
    prior = (log_prior - torch.logsumexp(log_prior, 0)).float()
    if not bias:  # the prior rides on a constant feature 0 (kept out of the outliers)
        outliers = outliers[outliers != 0]
        x[:, 0] = 1.0
        w[:, 0] = 0.0
    x[:, outliers] *= knobs.outlier_scale
    sample = x[:min(n, knobs.calibration_rows)]
    scale, strength = _solve_scale(sample @ w.T, prior, knobs.mean_loss / (1 - knobs.confident_share))
    prior = prior * strength
    w *= scale
    if not bias:
        w[:, 0] = prior

    rows_per_chunk = max(1, 2**24 // c)
    head_bias = prior if bias else torch.zeros(c)
    target = torch.empty(n, dtype=torch.int64)
    top = torch.empty(n, dtype=torch.int64)
    for start in range(0, n, rows_per_chunk):  # Gumbel-max: a seeded draw from each row's softmax
        logits = x[start:start + rows_per_chunk] @ w.T + head_bias
        top[start:start + rows_per_chunk] = logits.argmax(1)
        uniform = torch.rand(logits.shape, generator=generator).clamp_min(torch.finfo(torch.float32).tiny)
        target[start:start + rows_per_chunk] = (logits - uniform.log().neg().log()).argmax(1)

    confident = torch.rand(n, generator=generator) < knobs.confident_share
    rows = confident.nonzero().flatten()
    low, high = knobs.confident_margin
    margin = low + (high - low) * torch.rand(len(rows), generator=generator)
    target[rows] = top[rows]
    direction = w[target[rows]]
    if not bias:  # move along the features other than the constant one
        direction[:, 0] = 0.0
    x[rows] += (margin / direction.square().sum(1))[:, None] * direction
    return Draw(x, w, prior.clone() if bias else None, target)


def _trained(shape: Shape, checkpoint: str, bias: bool, generator: torch.Generator | None) -> Draw:
    from analysis.core.head_dumps import load_head_dump

    dump = load_head_dump(checkpoint)
    rows, features = dump.x.shape
    classes = dump.weight.shape[0]
    if shape.D != features or shape.C != classes or shape.N > rows:
        raise ValueError(f"the trained:{checkpoint} family has D={features}, C={classes} and at most {rows} rows; "
                         f"got shape {shape}")
    b = torch.zeros(classes) if bias else None
    if generator is None:
        rows_taken = torch.arange(shape.N)
    else:
        rows_taken = torch.randperm(rows, generator=generator)[:shape.N].sort().values
    return Draw(dump.x[rows_taken].float(), dump.weight.float().clone(), b, dump.target[rows_taken].clone())


def confident_rows(margin: float, shape: Shape, dtype: torch.dtype, *, seed: int = 0) -> tuple[Draw, float]:
    """Rows whose target logit leads every other class by about ``margin`` nats, rounded to ``dtype``.

    Not a family (its shape is constrained and it returns ``dtype`` tensors): the input of the
    confident-rows tests and of :mod:`analysis.studies.margins`, where ``p_y - 1`` and
    ``lse - z_y`` cancel. ``x`` has orthogonal rows of norm ``sqrt(D)`` (so ``N <= D``); the other
    classes' weights are random (logits of standard deviation 3); row ``i``'s target is class
    ``i * (C // N)`` (distinct per row, so ``N <= C``), whose weight ``alpha_i * x_i / D`` gives it
    the logit ``alpha_i`` on row ``i`` and 0 on the rows orthogonal to it; ``alpha_i`` is the row's
    largest other logit plus ``margin``. Built in fp64 and rounded once, so the realized lead moves
    by the rounding of the weights: the second value returned is the smallest lead over the rows,
    measured in fp64 on the rounded tensors. No bias.
    """
    n, d, c = shape.N, shape.D, shape.C
    if n > d or n > c:
        raise ValueError(f"confident_rows needs N <= D (orthogonal rows) and N <= C (a target each), got {shape}")
    f64 = torch.float64
    generator = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, n, generator=generator, dtype=f64))
    x = q.T * d**0.5
    w = torch.randn(c, d, generator=generator, dtype=f64) * (RANDOM_LOGIT_SCALE / d**0.5)
    y = torch.arange(n) * (c // n)
    w[y] = 0.0
    others = (x @ w.T).amax(1)
    w[y] = (others + margin)[:, None] * x / d
    x, w = x.to(dtype), w.to(dtype)
    z = x.to(f64) @ w.to(f64).T
    lead = z[torch.arange(n), y] - z.scatter(1, y[:, None], -math.inf).amax(1)
    return Draw(x, w, None, y), float(lead.min())
