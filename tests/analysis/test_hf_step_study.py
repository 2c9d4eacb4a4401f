"""python -m analysis hf-step: the study's settings and arguments, its report from rows alone, its dry run."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.core.results_io import HF_STEP, file_kind
from analysis.gpu import check
from analysis.report import hf_step as report
from analysis.studies import hf_step


def test_the_cpu_setting_is_the_issues_step_and_the_budget_is_a_multiple_of_the_heads_gradients():
    setting = hf_step.SETTINGS["cpu"]
    assert (setting.hidden, setting.layers, setting.vocab, setting.tokens) == (512, 2, 128256, 2048)
    assert hf_step.head_budget(setting) == int(1.2 * (2048 + 128256) * 512 * 2)


def test_bad_arms_and_rounds_are_named():
    with pytest.raises(ValueError, match="arms must name some of"):
        hf_step.measure(hf_step.SETTINGS["dry-run"], arms=("unpatched", "nope"))
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        hf_step.measure(hf_step.SETTINGS["dry-run"], rounds=0)
    assert "CUDA only" in hf_step._unavailable("liger", "cpu")


def _rows(date: str = "2026-12-02T00:00:00+00:00") -> pd.DataFrame:
    base = dict(model="LlamaForCausalLM", optimizer="AdamW fused", device="cpu", param_dtype="float32",
                compute_dtype="bfloat16", hidden=512,
                layers=2, vocab=128256, batch=2, seq_len=1024, tokens=2048, logits_bytes=2048 * 128256 * 4, rounds=3,
                status="ok", device_name="CPU", cpu_model="CPU", num_threads=2, git_revision="abc", date=date)
    arms = [("unpatched", None, 3000, 20.0, 11.5), ("lce", "accurate", 1000, 40.0, 11.5001),
            ("lce recommend budget", "compact", 700, 50.0, 11.4999)]
    rows = [dict(base, arm=arm, policy=policy, acc_dtype="float32" if policy else None,
                 batch_chunk_size=256 if policy else None, class_chunk_size=1024 if policy == "compact" else None,
                 budget_bytes=160 * 2**20 if policy == "compact" else None, measured_peak_bytes=mib * 2**20,
                 predicted_head_peak_bytes=400 * 2**20 if policy else None, time_median_s=seconds, loss=loss)
            for arm, policy, mib, seconds, loss in arms]
    table = pd.DataFrame(HF_STEP.rows(pd.DataFrame(rows)))
    table["peak_ratio"] = table["measured_peak_bytes"] / 3000 / 2**20
    table["time_ratio"] = table["time_median_s"] / 20.0
    table["loss_diff"] = table["loss"] - 11.5
    return table


def test_the_report_reads_the_latest_run_only():
    old = _rows("2026-11-01T00:00:00+00:00").assign(measured_peak_bytes=1, git_revision="old")
    numbers = report.step_numbers(pd.concat([old, _rows()], ignore_index=True))
    assert numbers["arm"].tolist() == ["unpatched", "lce", "lce recommend budget"]
    assert numbers["peak_mib"].tolist() == [3000, 1000, 700]
    assert numbers["head options"].tolist()[1:] == ["accurate, acc float32, 256 rows",
                                                  "compact, acc float32, 256 rows x 1024 classes"]
    figure = report.plot_hf_step(_rows())
    assert figure.stem == "hf_step" and "128,256 classes" in figure.caption and "160 MiB budget" in figure.caption
    assert report.plot_hf_step(_rows(), "cuda") is None and report.draw_hf_step_figures(pd.DataFrame()) == []


def test_the_readme_passage_without_data_says_how_to_make_it(tmp_path):
    assert "run `python -m analysis hf-step`" in report.readme_hf_step(tmp_path)


@pytest.mark.slow
def test_the_gpu_checks_hf_step_runs_the_study_dry(tmp_path):
    """The opt-in GPU step, dry: every CPU arm in its own process on the tiny setting, one row each."""
    assert "hf" in [step.name for step in check.STEPS] and "hf" not in check.DEFAULT_STEPS
    assert check.run_step("hf", tmp_path, 300.0, dry_run=True) == 0
    path = tmp_path / "hf_step_cuda.csv"
    table = pd.read_csv(path)
    assert file_kind(path) == "hf_step" and table["arm"].tolist() == list(hf_step.DEFAULT_ARMS)
    assert set(table["status"]) == {"ok"} and table["peak_ratio"].iloc[0] == 1.0
    assert table["loss_diff"].abs().max() < 1e-3  # the same step's loss, through lce or not
    budget = table.set_index("arm").loc["lce recommend budget"]
    assert budget["class_chunk_size"] < budget["vocab"] and budget["peak_ratio"] < 1
