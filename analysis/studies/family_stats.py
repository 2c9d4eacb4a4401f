"""What each input family looks like to the op: the statistics that decide its numerics.

Per family (in fp64 on the family's fp32 draw): the mean loss, the
distribution of the target's probability ``p_target`` and of the target's
logit margin over the best other class, how far the largest feature
dimensions stand out (root-mean-square per feature dimension, over the median
one), and how often each class is a target (sorted: the rank-frequency curve,
whose log-log slope is about ``-s`` for a Zipf law of exponent ``s``).

``python -m analysis family-stats`` records :func:`family_statistics` (one
row per family and statistic) and :func:`rank_frequencies` (the curve) in
``analysis/results/family_stats.csv.gz``; notebook 05 and the figure
``families`` read them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from analysis.core.families import draw
from analysis.core.problem import Shape

__all__ = ["FAMILY_SHAPE", "STUDY_FAMILIES", "row_statistics", "family_statistics", "rank_frequencies", "study"]

FAMILY_SHAPE = Shape(2048, 128, 16384)
"""The trained model's head (D=128, C=16384) with as many rows as its dumps hold; every family is drawn at it."""

STUDY_FAMILIES: tuple[str, ...] = ("random", "calibrated:0.5", "calibrated", "calibrated:6", "trained:early",
                                   "trained")
"""The families compared: random, calibrated at three mean losses, the trained model early and final."""

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def row_statistics(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor
                   ) -> pd.DataFrame:
    """Per row, in fp64: ``loss``, ``p_target`` and ``margin`` (target logit minus the best other logit)."""
    logits = x.double() @ weight.double().T
    if bias is not None:
        logits += bias.double()
    rows = torch.arange(len(target))
    log_probs = torch.log_softmax(logits, dim=1)
    target_logit = logits[rows, target].clone()
    logits[rows, target] = -math.inf
    margin = target_logit - logits.amax(1)
    loss = -log_probs[rows, target]
    return pd.DataFrame({"loss": loss.numpy(), "p_target": loss.neg().exp().numpy(), "margin": margin.numpy()})


def _feature_outlier_ratio(x: torch.Tensor) -> float:
    rms = x.double().square().mean(0).sqrt()
    return float(rms.max() / rms.median())


def _zipf_slope(counts: np.ndarray) -> float:
    """Least-squares slope of log(count) on log(rank) over the classes targeted at least twice."""
    counts = np.sort(counts[counts >= 2])[::-1]
    if len(counts) < 3:
        return math.nan
    ranks = np.arange(1, len(counts) + 1)
    return float(np.polyfit(np.log(ranks), np.log(counts), 1)[0])


def family_statistics(family: str, shape: Shape = FAMILY_SHAPE, seed: int = 0) -> pd.DataFrame:
    """One row per statistic of ``family`` at ``shape``: ``family``, ``statistic``, ``value``."""
    drawn = draw(family, shape, seed=seed)
    rows = row_statistics(drawn.x, drawn.weight, drawn.bias, drawn.target)
    counts = torch.bincount(drawn.target, minlength=shape.C).numpy()
    values: dict[str, float] = {
        "mean_loss": rows["loss"].mean(),
        "share_p_target_above_0.999": (rows["p_target"] > 0.999).mean(),
        "share_margin_above_16": (rows["margin"] > 16).mean(),
        "max_margin": rows["margin"].max(),
        "feature_rms_max_over_median": _feature_outlier_ratio(drawn.x),
        "distinct_targets": float((counts > 0).sum()),
        "top_class_share": counts.max() / shape.N,
        "zipf_slope": _zipf_slope(counts),
    }
    for q in QUANTILES:
        values[f"p_target_q{q:g}"] = rows["p_target"].quantile(q)
        values[f"margin_q{q:g}"] = rows["margin"].quantile(q)
    return pd.DataFrame({"family": family, "statistic": list(values), "value": [float(v) for v in values.values()]})


def rank_frequencies(family: str, shape: Shape = FAMILY_SHAPE, seed: int = 0) -> pd.DataFrame:
    """The targets' rank-frequency curve: ``family``, ``rank`` (1 = most frequent), ``count`` (classes hit)."""
    counts = np.sort(torch.bincount(draw(family, shape, seed=seed).target, minlength=shape.C).numpy())[::-1]
    counts = counts[counts > 0]
    return pd.DataFrame({"family": family, "rank": np.arange(1, len(counts) + 1), "count": counts})


def study(families: Sequence[str] = STUDY_FAMILIES, shape: Shape = FAMILY_SHAPE, seed: int = 0) -> pd.DataFrame:
    """Every family's statistics and rank-frequency curve, as rows of the ``family_stats`` results kind."""
    frames = []
    for family in families:
        stats = family_statistics(family, shape, seed)
        curve = rank_frequencies(family, shape, seed)
        frames.append(stats.assign(rank=math.nan))
        frames.append(pd.DataFrame({"family": family, "statistic": "target_count", "rank": curve["rank"],
                                    "value": curve["count"].astype(float)}))
    table = pd.concat(frames, ignore_index=True)
    return table.assign(N=shape.N, D=shape.D, C=shape.C, seed=seed)


# ---- python -m analysis family-stats -------------------------------------------------------------------------

DESCRIPTION = ("Draws every family of analysis.studies.family_stats at the trained head's shape and writes "
               "family_stats.csv.gz (an earlier one becomes .previous); about a minute. `figures` draws it.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, family_names, results_option

    parser.add_argument("--family", type=argument(family_names), default=None, metavar="NAME[,NAME]",
                        help="these families only (default: random, calibrated at 0.5/3/6 nats, trained early/final)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default: 0)")
    results_option(parser)


def run(args) -> None:
    from analysis.core.arguments import set_aside_announced
    from analysis.core.provenance import provenance
    from analysis.core.results_io import FAMILY_STATS, append_rows
    from analysis.paths import display_path

    table = study(args.family or STUDY_FAMILIES, seed=args.seed)
    path = args.results / "family_stats.csv.gz"
    set_aside_announced(path)
    append_rows(path, FAMILY_STATS.rows(table.assign(**provenance("cpu"))))
    summary = table[table["statistic"] != "target_count"].pivot(index="statistic", columns="family", values="value")
    print(summary.to_string(float_format="%.4g"))
    print(display_path(path))
