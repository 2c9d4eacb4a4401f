"""lce.distributed: vocab-parallel linear cross-entropy, 2 and 3 CPU processes over gloo (loopback).

Each test spawns a group that runs one scenario of tests/lce/distributed_cases.py and judges what the ranks saved:
fp64 equality with single-process lce on the unsharded weight (1e-12 relative) for every policy and reduction with
bias, class weights, ignore_index, smoothing, soft-capping, z-loss, 1-D input and class tiling; bf16/fp16 floors
within 10% of single-process lce; zero gradients for an all-ignored batch; bad input failing on every rank with
the group still usable after; the module. Collectives time out (60 s), so a broken case fails instead of hanging.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from distributed_cases import RANDOM_CASES, N, run_group

pytestmark = [pytest.mark.slow,  # every test spawns a process group
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="needs torch.distributed with gloo")]


@pytest.fixture(autouse=True)
def _native_cpu_gemms_in_the_ranks(monkeypatch):
    """The ranks are new processes, which would decide lce.planning.cpu_gemms' verdict each on its own; the environment
    pins
    it in every rank, as the tests' fixture pins it in-process, so that the expectations hold on every CPU kind."""
    monkeypatch.setenv("LCE_CPU_GEMMS", "native")


def _spawn(world: int, scenario: str, folder) -> list[list[dict]]:
    mp.spawn(run_group, args=(world, str(folder / "rendezvous"), scenario, str(folder)), nprocs=world, join=True)
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


@pytest.mark.parametrize("world", [3])  # uneven 10/15/12; two ranks run in the tests below
def test_fp64_equals_single_process_lce(world, tmp_path):
    for rank, rows in enumerate(_spawn(world, "fp64", tmp_path)):
        assert len(rows) == 45
        for row in rows:
            worst = max(row[key] for key in ("loss", "grad_input", "grad_weight", "grad_bias"))
            assert worst <= 1e-12, f"{world} ranks, rank {rank}, {row['label']}: {row}"


@pytest.mark.parametrize("world", [2])
def test_low_precision_floors_match_single_process(world, tmp_path):
    ranks = _spawn(world, "low_precision", tmp_path)
    assert ranks[0] == ranks[-1]  # every rank saw the same full gradients
    for row in ranks[0]:
        for output in ("grad_input", "grad_weight"):
            single, sharded = row[f"single_{output}"], row[f"sharded_{output}"]
            assert abs(sharded / single - 1) <= 0.10, f"{world} ranks, {row['label']} {output}: {sharded:.3f} " \
                                                      f"floors sharded against {single:.3f} single-process"


def test_all_ignored_batch_gets_zero_gradients(tmp_path):
    for rows in _spawn(2, "all_ignored", tmp_path):
        by_reduction = {row["reduction"]: row for row in rows}
        assert torch.isnan(by_reduction["mean"]["loss"])
        assert float(by_reduction["sum"]["loss"]) == 0.0
        assert torch.equal(by_reduction["none"]["loss"], torch.zeros(N, dtype=torch.float64))
        assert all(row["max_grad"] == 0.0 for row in rows)


@pytest.mark.parametrize("world", [2, 4])  # shards [1, 36] and [1, 20, 3, 13]
def test_uneven_shards_equal_single_process_lce(world, tmp_path):
    """Issue 24: every rank walks the same row chunks whatever its shard's size (a single class, fewer classes
    than in_features), for every policy, reduction and chunking, automatic included."""
    for rank, rows in enumerate(_spawn(world, "uneven", tmp_path)):
        assert len(rows) == 3 * 3 * 5
        for row in rows:
            worst = max(row[key] for key in ("loss", "grad_input", "grad_weight", "grad_bias"))
            assert worst <= 1e-12, f"{world} ranks, rank {rank}, {row['label']}: {row}"


def test_the_reported_uneven_case_completes_on_every_rank(tmp_path):
    """Issue 24's report: shards 10, 3, 19 under automatic chunking aborted ranks 0 and 2 inside gloo."""
    for rank, (row,) in enumerate(_spawn(3, "reported", tmp_path)):
        worst = max(row[key] for key in ("loss", "grad_input", "grad_weight", "grad_bias"))
        assert worst <= 1e-12, f"rank {rank}: {row}"


@pytest.mark.parametrize("world", [4])
def test_random_shards_and_options_equal_single_process_lce(world, tmp_path):
    for rank, rows in enumerate(_spawn(world, "random", tmp_path)):
        assert len(rows) == RANDOM_CASES
        for row in rows:
            worst = max(row[key] for key in ("loss", "grad_input", "grad_weight", "grad_bias"))
            assert worst <= 1e-12, f"{world} ranks, rank {rank}, {row['label']}: {row}"


EXPECTED_ERRORS = {
    "rows differ": "disagree on input shape",
    "dtype differs": "disagree on input shape or dtype",
    "shards do not add up": "not num_classes=38",
    "target out of range": "must lie in [0, 37)",
    "targets differ": "disagree on target",
    "bad bias shard": "rank 0: ValueError: linear_bias must have shape",
    "bad softcap": "softcap must be a finite float > 0",
    "bad loss_dtype": "rank 0: ValueError: loss_dtype must be None or one of",
    "options differ": "disagree on options",
    "chunking differs": "disagree on options",
    "bad options type": "TypeError: options must be None or a LinearCrossEntropyOptions",
    "requires grad differs": "disagree on the device kind or which tensors require grad",
}


@pytest.mark.parametrize("world", [2, 3])
def test_bad_input_fails_on_every_rank_and_never_hangs(world, tmp_path):
    ranks = _spawn(world, "bad_inputs", tmp_path)
    for rank, rows in enumerate(ranks):
        by_case = {row["case"]: row for row in rows}
        for case, text in EXPECTED_ERRORS.items():
            assert by_case[case]["error"] == "ValueError", f"rank {rank}, {case}: {by_case[case]}"
            assert text in by_case[case]["message"], f"rank {rank}, {case}: {by_case[case]['message']}"
    losses = {rows[-1]["message"] for rows in ranks}
    assert len(losses) == 1, f"after the errors every rank must still compute the same loss, got {losses}"


def test_a_loss_scale_of_2_16_reaches_every_shard_and_keeps_what_one_process_keeps(tmp_path):
    """fp16 shards, an fp32 loss scaled by 2**16: every gradient finite, no more entries lost to fp16's subnormal
    range than single-process lce loses (which the single-device tests hold to the autocast reference)."""
    for rank, rows in enumerate(_spawn(2, "loss_scale", tmp_path)):
        assert len(rows) == 6
        for row in rows:
            assert row["loss_dtype"] == "torch.float32", row
            for name in ("input", "weight", "bias"):
                assert row[f"{name}_finite"], (rank, row)
                assert row[f"{name}_lost_sharded"] <= row[f"{name}_lost_single"] + 2, (rank, row)
                assert row[f"{name}_rel"] <= 1e-2, (rank, row)
            assert row["weight_lost_before"] > 40 * (row["weight_lost_sharded"] + 1), (rank, row)


@pytest.mark.parametrize("world", [3])  # shards [5, 1, 31]: a one-class rank between two others
def test_vocab_parallel_log_probs_and_entropy_equal_the_fp64_formula(world, tmp_path):
    """Issue 32: per-token log-probabilities, entropy and their gradients on uneven shards (a rank with one class),
    every policy, row chunking and class tiling, scalar and per-row temperatures, soft-capping, ignore_index."""
    for rank, rows in enumerate(_spawn(world, "log_probs", tmp_path)):
        *parity, bad = rows
        assert len(parity) == 3 * 2 * 3 * 2
        for row in parity:
            worst = max(row[key] for key in ("log_probs", "entropy", "grad_input", "grad_weight", "grad_bias"))
            assert worst <= 1e-12, f"{world} ranks, rank {rank}, {row['label']}: {row}"
        assert "rank 0: ValueError" in bad["error"] and "temperature must be a finite float > 0" in bad["error"], bad


def test_vocab_parallel_ops_under_autocast_equal_the_calls_on_cast_shards(tmp_path):
    """Issue 42: under CPU autocast (bf16, fp16), fp32 shards, each reduction and the log-probabilities give, bit
    for bit, what the calls outside autocast give on the shards cast to autocast's dtype (the loss in fp32)."""
    for rank, rows in enumerate(_spawn(2, "autocast", tmp_path)):
        assert len(rows) == 6, rows
        for row in rows:
            assert all(row["equal"]), f"rank {rank}, {row['label']}: {row}"
            assert row["dtypes"][0] == "torch.float32", row  # the loss and the log-probabilities in fp32
            assert row["dtypes"][-3:] == ["torch.float32"] * 3, row  # the fp32 leaves' gradients


@pytest.mark.parametrize("world", [2, 3])
def test_vocab_parallel_rows_do_not_depend_on_their_batch(world, tmp_path):
    """Issue 51: batch_invariant=True keeps the contract on uneven bf16 shards: each row's log-probabilities,
    entropy, per-row loss and input gradients are the same bits in other batches."""
    for rank, rows in enumerate(_spawn(world, "batch_invariance", tmp_path)):
        assert len(rows) == 4
        for row in rows:
            assert row["nonzero"] and all(row["equal"].values()), f"{world} ranks, rank {rank}: {row}"


def test_module_matches_single_process(tmp_path):
    for rows in _spawn(3, "module", tmp_path):
        (row,) = rows
        assert row["loss"] <= 1e-12 and row["grad_weight"] <= 1e-12, row
        assert "shard_sizes=[10, 15, 12]" in row["repr"]


def test_the_example_runs_under_torchrun():
    """examples/vocab_parallel.py, as the README runs it (two CPU processes, a free local port)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "examples/vocab_parallel.py", "--rows", "256", "--classes", "3001", "--dtype", "float64"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = next(line for line in done.stdout.splitlines() if line.startswith("one process"))
    errors = [float(part.split()[0].rstrip(",")) for part in summary.split(" by ")[1:]]
    assert len(errors) == 3 and max(errors) < 1e-12, summary
    assert "rank 1: classes [1501, 3001)" in done.stdout
