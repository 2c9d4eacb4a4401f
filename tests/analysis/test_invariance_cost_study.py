"""analysis.studies.invariance_cost: both arms timed, each row's plan the arm it names, resumable."""

from __future__ import annotations

from analysis.core.problem import Shape
from analysis.core.results_io import INVARIANCE_COST, read_table
from analysis.studies import invariance_cost

SMALL = Shape(100, 32, 512)


def test_each_arm_is_timed_with_the_plan_it_names(tmp_path):
    path, _ = invariance_cost.record(tmp_path, problems=(SMALL,), dtypes=("bfloat16",), rounds=2, progress=False)
    table = read_table(path)
    assert list(table.columns) == list(INVARIANCE_COST.columns)
    assert len(table) == 2 * len(invariance_cost.OPS)
    for row in table.itertuples():
        invariant = row.arm == "batch-invariant"
        assert bool(row.batch_invariant) == invariant
        # the invariant arm runs whole chunks of its fixed rows; the other's rows follow N
        assert (row.loop_rows % row.batch_chunk_size == 0) if invariant else row.loop_rows == SMALL.N
        samples = [float(value) for value in str(row.time_samples).split()]
        assert len(samples) == 2 and all(s > 0 for s in samples) and row.time_s > 0
        assert row.cpu_model and row.git_revision


def test_a_rerun_measures_only_what_is_missing(tmp_path):
    invariance_cost.record(tmp_path, problems=(SMALL,), ops=("loss",), dtypes=("float32",), rounds=1,
                           progress=False)
    path, _ = invariance_cost.record(tmp_path, problems=(SMALL,), ops=("loss", "log_probs"), dtypes=("float32",),
                                     rounds=1, progress=False)
    table = read_table(path)
    assert sorted(table.groupby("op").size().items()) == [("log_probs", 2), ("loss", 2)]
