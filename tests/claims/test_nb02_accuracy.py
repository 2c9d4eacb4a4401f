"""Claims of notebook 02 and of the README's bf16 table: over the committed sweep results (section 1, the README) or
the notebook's own quick seeded measurement (growth, loss drift, all-ignored batch). A failure names the sentence."""

from __future__ import annotations

import functools

import pandas as pd

from analysis.judge import pareto
from analysis.report import nb02_accuracy
from analysis.report.nb02_accuracy import AT_FLOOR, ERROR
from analysis.studies import defects, growth

PROBLEM = ["family", "dtype", "N", "D", "C"]


@functools.cache
def _errors(dtypes: tuple[str, ...] = ("bfloat16", "float16")) -> pd.DataFrame:
    errors = nb02_accuracy.policy_errors(pareto.load_table()[1])
    return errors[errors["dtype"].isin(dtypes)]


def _setting(name: str, dtypes: tuple[str, ...] = ("bfloat16", "float16")) -> pd.DataFrame:
    errors = _errors(dtypes)
    return errors[errors["setting"] == name].set_index(PROBLEM)


def test_lce_default_is_at_the_floor_in_bf16_and_in_fp16_where_its_gradients_are_normal():
    """"In bf16 lce's default options return the exact answer rounded once ...; in bf16 and fp16 their loss at most
    ...; in fp16 their gradients are at the floor at 32 rows ... and at {1.02–1.12} floors at 1024–2048 rows, where
    a "mean" gradient lies largely in fp16's subnormal range and lce's fp16 headroom rounds it twice" (docs/findings.md:
    "lce's default returns the exactly rounded loss and gradients [in bf16] on every input family and shape")."""
    default = _setting("lce default")
    assert (default["loss_fro_in_floors_high"] < AT_FLOOR).all()
    bf16 = default.xs("bfloat16", level="dtype")
    assert (bf16[[ERROR, f"{ERROR}_high"]] < AT_FLOOR).all().all()
    fp16 = default.xs("float16", level="dtype")[ERROR]
    few_rows = fp16.index.get_level_values("N") == 32
    assert (fp16[few_rows] < AT_FLOOR).all() and (fp16[~few_rows] > AT_FLOOR).all() and (fp16 < 1.15).all()


def test_torch_default_is_worse_than_lce_default_on_every_low_precision_problem():
    """"torch's defaults have a larger worst gradient error than lce's on every family, dtype and shape"."""
    torch = _setting("torch default")[ERROR]
    assert len(torch) and (torch > _setting("lce default")[ERROR].reindex(torch.index)).all()


def test_explicit_policies_without_acc_dtype_are_worse_than_the_default():
    """"An explicit lce policy without `acc_dtype` ... costs ... floors, more than the default everywhere"."""
    for policy in ("accurate", "balanced", "compact"):
        explicit = _setting(f"lce {policy}")[ERROR]
        assert (explicit > _setting("lce default")[ERROR].reindex(explicit.index)).all(), policy


def test_with_acc_fp32_accurate_is_at_the_floor_and_balanced_equals_compact():
    """"`accurate` returns the default's numbers again (... in bf16), while `balanced` and `compact` ... return the
    same numbers, reach ... floors in bf16 and ... in fp16" (fp16: the default's, since the CPU layouts compute
    fp16 GEMMs in fp32)."""
    default, accurate = _setting("lce default"), _setting("lce accurate, acc fp32")
    assert (accurate.xs("bfloat16", level="dtype")[ERROR] < AT_FLOOR).all()
    pd.testing.assert_series_equal(accurate[ERROR], default.loc[accurate.index, ERROR])
    balanced, columns = _setting("lce balanced, acc fp32"), list(nb02_accuracy.OUTPUTS.values())
    pd.testing.assert_frame_equal(balanced[columns], _setting("lce compact, acc fp32").loc[balanced.index, columns])
    assert (balanced.xs("bfloat16", level="dtype")[ERROR] > AT_FLOOR).all()
    fp16 = balanced.xs("float16", level="dtype").index
    pd.testing.assert_series_equal(balanced.xs("float16", level="dtype")[ERROR],
                                   default.xs("float16", level="dtype").loc[fp16, ERROR])


def test_fp32_lce_default_is_never_worse_than_the_unfused_computation_and_torch_is():
    """"lce's default is at ...x its error, never above it, and torch's default at up to ...x"."""
    lce, torch = (_setting(name, ("float32",))[pareto.VS_UNFUSED] for name in ("lce default", "torch default"))
    assert lce.max() <= 1 < torch.max()


def test_trained_seeds_at_the_dumps_row_count_are_the_same_inputs():
    """Limits: "the `trained` family at N=2048 takes every row of the LM dump, so its seeds are the same inputs"."""
    trained = _errors()[(_errors()["family"] == "trained") & (_errors()["N"] == 2048)]
    assert len(trained) and (trained[f"{ERROR}_low"] == trained[f"{ERROR}_high"]).all()


def test_readme_torch_default_is_above_the_floor_on_the_loss_and_the_weight_and_bias_gradients():
    """README: "torch's default does not, its loss, grad_weight and grad_bias are above the rounding floor"."""
    columns = ["loss_fro_in_floors", "grad_weight_fro_in_floors", "grad_bias_fro_in_floors"]
    assert (_setting("torch default", ("bfloat16",))[columns] > AT_FLOOR).all().all()


def test_readme_balanced_with_acc_fp32_is_above_the_floor_on_grad_input_and_grad_weight_only():
    """README: "`balanced` with an fp32 accumulator is above the floor on grad_input and grad_weight only"."""
    bf16 = _setting("lce balanced, acc fp32", ("bfloat16",)).filter(like="_fro_in_floors")
    assert (bf16[["grad_input_fro_in_floors", "grad_weight_fro_in_floors"]] > AT_FLOOR).all().all()
    assert (bf16[["loss_fro_in_floors", "grad_bias_fro_in_floors"]] < AT_FLOOR).all().all()


@functools.cache
def _fits() -> pd.DataFrame:
    shape, counts = nb02_accuracy.QUICK_GROWTH
    return pd.concat([growth.fit_power_law(growth.chunk_growth(shape, "bfloat16", chunk_counts=counts, device=device))
                      .assign(layouts=device) for device in ("cpu", "cuda-emulated")], ignore_index=True)


def test_only_per_chunk_rounding_grows_with_the_chunk_count():
    """"lce's `compact` [on the emulated CUDA layouts] grows ...; torch's op grows the same way under every policy on
    the CPU ... Every other lce series is flat"."""
    fits = _fits()
    grows = set(zip(*(fits.loc[nb02_accuracy.grows(fits), c] for c in ("impl", "layouts", "policy")), strict=True))
    assert grows == {("lce", "cuda-emulated", "compact")} | {("torch", "cpu", p) for p in fits["policy"].unique()}


def test_accurate_stays_at_the_floor_at_every_chunk_count():
    """"`accurate` stays at ... floors on both layout tables"."""
    accurate = _fits()[(_fits()["impl"] == "lce") & (_fits()["policy"] == "accurate")]
    assert len(accurate) == 2 and (accurate["at_max_chunks"] < AT_FLOOR).all()


@functools.cache
def _drift() -> pd.DataFrame:
    shape, counts, seeds = nb02_accuracy.QUICK_DRIFT
    return nb02_accuracy.worst_drift(pd.concat([defects.loss_drift(shape, "bfloat16", counts, seed=seed)
                                                for seed in seeds], ignore_index=True))


def test_lce_loss_is_correctly_rounded_at_every_chunk_count():
    """"lce's bf16 loss is correctly rounded at every chunk count: at most ... ulps (0.5 or less ...)"."""
    assert _drift()["lce"].max() <= 0.5


def test_torch_loss_drifts_beyond_an_ulp_at_the_most_chunks():
    """"torch's loss is ... ulps off with 1 chunk and ... with 64, more than one ulp at ... chunks"."""
    assert _drift()["torch"].iloc[-1] > max(1.0, _drift()["torch"].iloc[0])


def test_all_ignored_batch_nan_loss_everywhere_zero_lce_gradients_and_all_nan_torch_gradients():
    """"the mean loss is 0/0, NaN, for all three ops ... lce returns gradients that are all zero, like the reference;
    torch's op returns NaN in ... of its ... gradient entries, every one of them"."""
    ignored = defects.all_ignored_gradients()
    nans = nb02_accuracy.nan_gradients(ignored).set_index("impl")
    assert ignored["loss"].isna().all() and (nans.loc[["lce", "reference"], ["nan", "largest"]] == 0).all().all()
    assert nans.loc["torch", "nan"] == nans.loc["torch", "entries"] > 0
