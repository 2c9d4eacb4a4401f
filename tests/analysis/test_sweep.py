"""analysis.sweep.run: resumable after a crash (between rows or inside one), shards that partition a grid, the CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import lce.planning.cpu_gemms
from analysis.cli import main
from analysis.core.emulated_gemms import Fp32LowPrecisionGemms, low_precision_linear
from analysis.core.memory import measure_peak
from analysis.core.results_io import COLUMNS, read_rows
from analysis.core.run_config import RunConfig
from analysis.sweep.grids import GRIDS, get_grid
from analysis.sweep.run import measure_run, parse_shard, results_path, run_grid
from helpers import own_cpu_gemms
from lce.testing import cpu_gemms

ROOT = Path(__file__).resolve().parents[2]


class InjectedCrash(BaseException):
    """Stands for a killed process: not an Exception, so the sweep does not record it."""


def _crashing_measurer(crash_on: int):
    calls = {"n": 0}

    def measure(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == crash_on:
            raise InjectedCrash
        return measure_run(*args, **kwargs)

    return measure


def test_resume_after_crash_neither_duplicates_nor_loses_rows(tmp_path):
    grid = get_grid("tiny")
    with pytest.raises(InjectedCrash):
        run_grid(grid, folder=tmp_path, progress=False, measure=_crashing_measurer(crash_on=5))
    path = results_path("tiny", folder=tmp_path)
    before = read_rows(path)
    assert [row["key"] for row in before] == [c.key for c in grid.configs[:4]]  # only the run in flight is lost

    summary = run_grid(grid, folder=tmp_path, progress=False)
    after = read_rows(path)
    assert summary.skipped_done == 4 and summary.ran == len(grid.configs) - 4 and summary.errors == 0
    assert sorted(row["key"] for row in after) == sorted(c.key for c in grid.configs)
    assert after[:4] == before  # finished rows are kept as they were
    assert all(row["status"] == "ok" for row in after)
    assert run_grid(grid, folder=tmp_path, progress=False).ran == 0  # a third run has nothing left


def test_resume_after_an_unfinished_last_row(tmp_path):
    """A crash in the middle of writing a row leaves a line without newline: resuming reruns that run only."""
    grid = get_grid("tiny")
    path = results_path("tiny", folder=tmp_path)
    run_grid(grid, folder=tmp_path, progress=False, configs=grid.configs[:2])
    complete = path.read_bytes()
    path.write_bytes(complete + f"sweep,{grid.configs[2].key},tiny,reference,flo".encode())
    assert [row["key"] for row in read_rows(path)] == [c.key for c in grid.configs[:2]]
    summary = run_grid(grid, folder=tmp_path, progress=False, configs=grid.configs[:3])
    assert summary.skipped_done == 2 and summary.ran == 1
    assert path.read_bytes().startswith(complete)
    assert [row["key"] for row in read_rows(path)] == [c.key for c in grid.configs[:3]]
    assert len(pd.read_csv(path)) == 3


def test_an_exception_in_one_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    grid = get_grid("tiny")
    configs = list(grid.configs[:3])
    configs[1] = dataclasses.replace(configs[1], policy="no-such-policy")
    summary = run_grid(grid, folder=tmp_path, progress=False, configs=configs)
    rows = read_rows(summary.path)
    assert [row["status"] for row in rows] == ["ok", "error", "ok"]
    assert "acc_policy" in rows[1]["note"] and summary.errors == 1


@pytest.mark.parametrize("name", sorted(GRIDS))
@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_every_grid(name, count):
    grid = get_grid(name)
    shards = [grid.shard(index, count) for index in range(1, count + 1)]
    keys = [config.key for shard in shards for config in shard]
    assert len(keys) == len(set(keys)) == len(grid.configs)
    assert set(keys) == {config.key for config in grid.configs}


def test_shard_parsing_and_paths(tmp_path):
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
    assert results_path("quick", (2, 4), tmp_path).name == "quick.shard-2-of-4.csv"
    with pytest.raises(ValueError, match="grid"):
        get_grid("nope")


def test_rows_carry_config_and_provenance_columns(tmp_path):
    grid = get_grid("tiny")
    summary = run_grid(grid, folder=tmp_path, progress=False, configs=grid.configs[:2])
    table = pd.read_csv(summary.path)
    assert list(table.columns) == list(COLUMNS)
    for column in ("lce_version", "torch_version", "device_name", "cpu_model", "git_revision", "date"):
        assert table[column].notna().all(), column
    lce_row = table[table["op"] == "lce"].iloc[0]
    assert lce_row["num_chunks"] >= 1 and lce_row["peak_bytes_modeled"] > 0 and lce_row["peak_bytes_measured"] > 0
    assert RunConfig(**{f.name: lce_row[f.name] for f in dataclasses.fields(RunConfig)
                        if f.name not in ("policy", "chunking")}, policy=lce_row["policy"],
                     chunking=lce_row["chunking"]).key == lce_row["key"]


@pytest.mark.slow
def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "analysis", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "reproduce" in result.stdout and "sweep" in result.stdout


@pytest.mark.slow
def test_tiny_reproduce_end_to_end(tmp_path, capsys):
    """A user's reproduction: lce (and the workers, which adopt its verdict) plan with this CPU's own GEMM verdict,
    not the suite's native pin, so an AVX2-only CPU does not run the peers' bf16 GEMMs on its emulated kernel."""
    results, figures = tmp_path / "results", tmp_path / "figures"
    with own_cpu_gemms():
        assert main(["reproduce", "--grid", "tiny", "--results", str(results), "--out", str(figures),
                     "--no-progress"]) == 0
    assert len(pd.read_csv(results / "tiny.csv")) == len(get_grid("tiny").configs)
    index = (figures / "README.md").read_text()
    assert {path.name for path in results.iterdir()} == {"tiny.csv", "memory_breakdown.csv", "memory_trace.csv.gz",
                                                         "reproduce.csv"}
    timed = pd.read_csv(results / "reproduce.csv")
    assert list(timed["grid"]) == ["tiny"] and list(timed["runs"]) == [len(get_grid("tiny").configs)]
    assert (timed["total_s"] >= timed["sweep_s"] + timed["figures_s"]).all()
    for stem in ("error_vs_memory_cpu", "error_vs_chunks_cpu", "memory_measured_vs_modeled", "time_vs_shape",
                 "error_vs_memory_cuda-emulated", "memory_breakdown", "memory_trace"):
        assert (figures / f"{stem}.png").stat().st_size > 0 and not (figures / f"{stem}.svg").exists()
        assert f"## {stem}" in index
    assert "python -m analysis reproduce --grid tiny" in index and "auto = " in index
    assert main(["sweep", "--grid", "tiny", "--results", str(results), "--no-progress"]) == 0
    assert "0 run(s)" in capsys.readouterr().out  # resumed: nothing left to run
    assert main(["reproduce", "--grid", "tiny", "--resume", "--results", str(results), "--out", str(figures),
                 "--no-progress"]) == 0
    assert "0 run(s)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("support", ["native", "emulated"])
def test_workers_write_the_same_rows_as_one_process(tmp_path, support):
    """Two worker processes (spawned) fill one file: every run once, the same errors and the same CPU GEMM verdict
    as a serial sweep. The workers plan with the parent's verdict (lce.planning.cpu_gemms.adopt), whichever it is;
    deciding
    their own, 1-thread workers on a loaded AVX2-only CPU once disagreed with their parent (issue 29)."""
    grid = get_grid("tiny")
    with cpu_gemms(support):
        serial = run_grid(grid, folder=tmp_path / "serial", progress=False, workers=1)
        parallel = run_grid(grid, folder=tmp_path / "parallel", progress=False, workers=2)
    assert serial.ran == parallel.ran == len(grid.configs) and parallel.errors == 0
    one, two = (pd.read_csv(summary.path).set_index("key").sort_index() for summary in (serial, parallel))
    assert sorted(two.index) == sorted(c.key for c in grid.configs)
    error_columns = [c for c in one.columns if c.endswith("_fro_in_floors")]
    pd.testing.assert_frame_equal(one[error_columns], two[error_columns])
    assert (one["cpu_gemms"] == two["cpu_gemms"]).all() and one["cpu_gemms"].str.startswith(f"bfloat16 {support}").all()
    if support == "native":
        again = run_grid(grid, folder=tmp_path / "parallel", progress=False, workers=2)
        assert again.ran == 0 and again.skipped_done == len(grid.configs)


def test_a_custom_measure_cannot_be_sent_to_workers(tmp_path):
    with pytest.raises(ValueError, match="workers=1"):
        run_grid(get_grid("tiny"), folder=tmp_path, progress=False, workers=2, measure=lambda *a, **k: {})


def test_on_a_cpu_that_emulates_bf16_the_peers_errors_are_measured_and_their_costs_are_not(tmp_path):
    """lce.planning.cpu_gemms says "emulated" (forced here): torch's op and the unfused reference run their bf16 GEMMs
    on
    fp32 copies (analysis.core.emulated_gemms), so their errors match the native run's and no time or memory is
    claimed for them; lce and the fp32 runs are measured as ever."""
    grid = get_grid("tiny")
    native = pd.read_csv(run_grid(grid, folder=tmp_path / "native", progress=False).path).set_index("key")
    with cpu_gemms("emulated"):
        emulated = pd.read_csv(run_grid(grid, folder=tmp_path / "emulated", progress=False).path).set_index("key")
    assert (emulated["status"] == "ok").all()
    peers = emulated["op"].isin(["torch", "reference"]) & (emulated["dtype"] == "bfloat16")
    timed = emulated["time_median_s"].notna()
    assert peers.sum() == 14 and not (peers & timed).any() and emulated.loc[peers, "peak_bytes_measured"].isna().all()
    assert emulated.loc[peers, "note"].str.contains("emulates bfloat16 GEMMs").all()
    assert (timed == (~peers & native["time_median_s"].notna())).all()  # everything else as measured natively
    # (followed by "; ISA capped: ..." where the run had a CPU-kind stand-in's caps: analysis.core.provenance)
    assert emulated["cpu_gemms"].str.startswith("bfloat16 emulated (lce.testing.cpu_gemms), "
                                                "float16 emulated (lce.testing.cpu_gemms)").all()
    for column in [c for c in emulated.columns if c.endswith("_fro_in_floors")]:
        both = emulated[column].notna()
        assert both.equals(native[column].notna()), column
        gap = emulated.loc[both, column] - native.loc[both, column]
        # the peers: the same arithmetic up to fp32 summation order, so the floors agree closely run for run
        assert (gap[peers].abs() <= 0.05 * native.loc[both & peers, column] + 0.05).all(), column
        # lce: the same numbers, or less error where a bf16 GEMM became an fp32 one (compact/balanced, acc fp32)
        assert (gap[~peers] <= 0.05 * native.loc[both & ~peers, column] + 0.05).all(), column


@pytest.mark.slow
def test_tiny_reproduce_end_to_end_where_bf16_gemms_are_emulated(tmp_path, monkeypatch):
    """The whole reproduction on a CPU that emulates bf16/fp16 GEMMs (LCE_CPU_GEMMS=emulated, which the sweep's
    worker processes read too): it completes, the peers' costs are absent and said to be, and every figure draws."""
    monkeypatch.setenv("LCE_CPU_GEMMS", "emulated")
    gemms = lce.planning.cpu_gemms
    token = gemms.CPU_GEMMS_OVERRIDE.set(None)  # this process too: lift the suite's pin (tests/conftest.py)
    monkeypatch.setattr(gemms, "_environment_setting", lambda: gemms.parse_setting("emulated"))
    results, figures = tmp_path / "results", tmp_path / "figures"
    try:
        assert main(["reproduce", "--grid", "tiny", "--results", str(results), "--out", str(figures),
                     "--no-progress"]) == 0
    finally:
        lce.planning.cpu_gemms.CPU_GEMMS_OVERRIDE.reset(token)
    sweep = pd.read_csv(results / "tiny.csv")
    peers = sweep["op"].isin(["torch", "reference"]) & (sweep["dtype"] == "bfloat16")
    assert (sweep["status"] == "ok").all() and sweep.loc[peers, "time_median_s"].isna().all()
    assert sweep["cpu_gemms"].str.startswith("bfloat16 emulated (LCE_CPU_GEMMS)").all()
    traced = set(pd.read_csv(results / "memory_trace.csv.gz")["config"])
    assert traced == {"lce auto", "lce balanced acc=fp32", "lce compact acc=bf16"}  # the peers are not traced
    for stem in ("error_vs_memory_cpu", "time_vs_shape", "memory_breakdown", "memory_trace"):
        assert (figures / f"{stem}.png").stat().st_size > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_unfused_training_arm_computes_the_same_on_fp32_copies_where_gemms_are_emulated(dtype):
    """analysis.core.emulated_gemms.low_precision_linear: forward and both backward products within one rounding of
    F.linear's in the same dtype (the same arithmetic, fp32 sums in another order)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 40, generator=g).to(dtype).requires_grad_()
    w = torch.randn(300, 40, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(24, 300, generator=g).to(dtype)
    native = torch.nn.functional.linear(x, w)
    native_grads = torch.autograd.grad(native, (x, w), grad)
    with cpu_gemms("emulated"):
        emulated = low_precision_linear(x, w)
    emulated_grads = torch.autograd.grad(emulated, (x, w), grad)
    eps = torch.finfo(dtype).eps
    for got, want in ((emulated, native), *zip(emulated_grads, native_grads, strict=True)):
        assert got.dtype == dtype
        assert torch.all((got.double() - want.double()).abs() <= 2 * eps * want.double().abs() + 1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_stand_in_rounds_each_gemm_once_in_every_form_and_its_kept_scratch_is_not_measured(dtype):
    """Fp32LowPrecisionGemms: mm, addmm and bmm, plain and out= (into a strided view, as TRL's tiles are), give the
    fp32 product of the operands rounded once, bit for bit; with keep_scratch, after one warm-up call a measured
    call allocates exactly what the native op would (its result), not the fp32 copies."""
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(24, 40, generator=g).to(dtype), torch.randn(30, 40, generator=g).to(dtype)
    bias = torch.randn(30, generator=g).to(dtype)
    once = (a.float() @ b.float().T).to(dtype)
    for keep_scratch in (False, True):
        stand_in = Fp32LowPrecisionGemms(keep_scratch=keep_scratch)
        tile = torch.zeros(24, 32, dtype=dtype)
        with stand_in:
            plain = a @ b.T
            torch.mm(a, b.T, out=tile[:, :30])
            shifted = torch.addmm(bias, a, b.T, beta=0.5)
            batched = torch.bmm(a[None], b.T[None])
        assert torch.equal(plain, once) and torch.equal(tile[:, :30], once) and not tile[:, 30:].any()
        assert torch.equal(shifted, (0.5 * bias.float() + a.float() @ b.float().T).to(dtype))
        assert torch.equal(batched[0], once)
        with stand_in:
            _, memory = measure_peak(lambda: a @ b.T)  # noqa: B023
        expected = once.numel() * once.element_size()
        assert memory.peak_bytes == expected if keep_scratch else memory.peak_bytes > 2 * expected


def test_a_bf16_runs_peak_remeasured_through_the_stand_in_is_lces_own_and_the_cpus_kernel_adds_only_its_scratch():
    """analysis.sweep.remeasure.measured_peak: the stand-in's kept scratch leaves lce's own bytes (the sweep's
    profiler), which the memory model counts; the run on this CPU's own bf16 kernels peaks at the same bytes where
    those kernels allocate only their results, and higher by at most one GEMM's packing scratch where they take some
    from torch's allocator (an AVX512-BF16 EPYC's oneDNN: issue 48), for each policy."""
    import functools

    import pandas as pd

    from analysis.core.emulated_gemms import native_gemm_scratch
    from analysis.core.implementations import make_implementation
    from analysis.core.inputs import make_inputs
    from analysis.core.problem import DTYPES
    from analysis.paths import RESULTS_DIR
    from analysis.sweep.remeasure import _config, measured_peak, modeled_peak

    table = pd.read_csv(RESULTS_DIR / "quick.csv", dtype=str, keep_default_na=False)
    rows = table[(table["op"] == "lce") & (table["device"] == "cpu") & (table["dtype"] == "bfloat16")
                 & (table["N"] == "32")].drop_duplicates("policy")
    assert len(rows) >= 3
    for _, row in rows.iterrows():
        config = _config(row)
        inputs = make_inputs(config.shape, DTYPES[config.dtype], family=config.family, seed=config.seed,
                             bias=config.bias)
        call = functools.partial(make_implementation(config.spec, config.device).run, inputs)
        call()  # the suite plans as on a CPU with native bf16 GEMMs (tests/conftest.py)
        own = measure_peak(call)[1].peak_bytes
        scratch = native_gemm_scratch(call)
        lces = measured_peak(config, inputs)
        assert lces == pytest.approx(modeled_peak(config), rel=0.01), config.spec  # the quick grid: within 0.6%
        if scratch == 0:
            assert lces == own > 0, config.spec
        else:
            assert lces <= own <= lces + scratch, (config.spec, lces, own, scratch)
