"""The training study: each arm's head loss, loss scaling, the tidy rows and the gaps they report."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import lce
from analysis.cli import main
from analysis.core.results_io import TRAINING, read_table
from analysis.lm.model import ModelConfig
from analysis.lm.train import TrainConfig, train
from analysis.studies import training

LONG = training.SETTINGS["long"]


@pytest.mark.parametrize("arm", training.ARMS + LONG.arms, ids=lambda arm: f"{arm.slug}-{arm.chunking}")
def test_every_arm_computes_the_head_loss_and_its_gradients(arm):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 16, generator=g, requires_grad=True)
    weight = (torch.randn(300, 16, generator=g) / 4).requires_grad_()
    targets = torch.randint(0, 300, (64,), generator=g)
    exact = torch.nn.functional.cross_entropy(hidden.double() @ weight.double().T, targets)
    exact_grads = torch.autograd.grad(exact, (hidden, weight))
    loss = training.head_loss_of(arm)(hidden, weight, targets)
    grads = torch.autograd.grad(loss, (hidden, weight))
    tolerance = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 3e-3}[arm.dtype]
    assert loss.item() == pytest.approx(exact.item(), rel=tolerance)
    for got, want in zip(grads, exact_grads, strict=True):
        assert got.dtype == torch.float32  # the gradient reaches the fp32 master weights
        assert (got.double() - want).norm() <= 4 * tolerance * want.norm()


def test_arms_have_distinct_loss_names_and_fp16_is_loss_scaled():
    names = {training.head_loss_of(arm).__qualname__ for arm in training.ARMS + LONG.arms}
    assert len(names) == len(training.ARMS) + 2  # the long setting's lce arms are new runs, its fp32 arm is not
    # the names the full study's checkpoints were keyed on
    assert "lce_head_loss[bfloat16,compact,aspect_ratio:2,acc=float32]" in names
    assert {arm.name for arm in training.ARMS if arm.loss_scaling} == {"fp16 accurate", "fp16 balanced",
                                                                        "fp16 compact"}


@pytest.mark.slow
def test_loss_scaled_training_logs_skipped_steps_and_resumes(tmp_path):
    config = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, context=8)
    tokens = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(0))
    arm = training.ARM_NAMES["fp16 compact"]
    settings = TrainConfig(steps=4, batch_size=2, eval_every=2, eval_windows=2, checkpoint_every=2)
    loss = training.head_loss_of(arm)
    train(config, settings, tokens, tokens, tmp_path / "a", loss, progress=False, loss_scaling=True)
    train(config, settings, tokens, tokens, tmp_path / "b", loss, progress=False, stop_after=2, loss_scaling=True)
    train(config, settings, tokens, tokens, tmp_path / "b", loss, progress=False, loss_scaling=True)
    logs = [pd.read_csv(tmp_path / name / "log.csv") for name in ("a", "b")]
    assert "skipped" in logs[0] and logs[0]["step"].max() == 4
    pd.testing.assert_frame_equal(logs[0].drop(columns="elapsed_s"), logs[1].drop(columns="elapsed_s"))
    with pytest.raises(ValueError, match="another configuration"):
        train(config, settings, tokens, tokens, tmp_path / "a", loss, progress=False, loss_scaling=False)


def _log_rows(arm: str, seed: int, steps: list[int], losses: list[float], setting_steps: int) -> pd.DataFrame:
    return pd.DataFrame({"arm": arm, "seed": seed, "step": steps, "loss": losses, "split": "heldout",
                         "steps": setting_steps})


def test_gaps_compare_each_finished_run_with_the_fp32_run_of_its_seed():
    table = pd.concat([
        _log_rows("fp32", 0, [0, 10], [9.0, 5.0], 10), _log_rows("fp32", 1, [0, 10], [9.0, 5.2], 10),
        _log_rows("bf16 compact", 0, [0, 10], [9.0, 5.1], 10), _log_rows("bf16 compact", 1, [0, 10], [9.0, 5.1], 10),
        _log_rows("bf16 balanced", 0, [0, 5], [9.0, 7.0], 10),  # unfinished: not compared
    ])
    last = training.final_losses(table).set_index(["arm", "seed"])
    assert last.loc[("bf16 compact", 0), "gap"] == pytest.approx(0.1)
    assert last.loc[("bf16 compact", 1), "gap"] == pytest.approx(-0.1)
    assert ("bf16 balanced", 0) not in last.index
    summary = training.summary(table)
    assert list(summary.index) == ["fp32", "bf16 compact"]
    assert summary.loc["fp32", "seed_spread"] == pytest.approx(0.2)
    assert summary.loc["bf16 compact", "gap_min"] == pytest.approx(-0.1)


@pytest.mark.slow
def test_train_command_writes_tidy_rows_with_provenance(tmp_path):
    assert main(["train", "--quick", "--arms", "fp32,bf16 compact", "--seeds", "1", "--workers", "1",
                 "--results", str(tmp_path), "--cache", str(tmp_path / "cache"), "--no-progress"]) == 0
    rows = read_table(tmp_path / "training_quick.csv.gz")
    assert set(rows["arm"]) == {"fp32", "bf16 compact"}
    assert set(rows["split"]) == {"train", "heldout", *training.BUCKET_SPLITS}
    assert rows["step"].max() == training.SETTINGS["quick"].steps
    assert list(rows.columns) == list(TRAINING.columns) and rows["torch_version"].notna().all()
    assert rows["loss"].between(5, 12).all()
    edges = training.bucket_edges_of(tmp_path / "training_quick.csv.gz")
    assert (tmp_path / "training_quick_buckets.json").exists() and not (tmp_path / "training_quick.csv").exists()
    assert list(edges.index) == ["frequent", "middle", "rare"] and edges["target_share"].sum() == pytest.approx(1)


def test_collect_reads_every_run_of_the_setting_whichever_call_trained_it(tmp_path):
    setting = training.SETTINGS["quick"]
    log = ("step,learning_rate,train_loss,heldout_loss,elapsed_s,skipped\n"
           "0,,,9.7,0.0,\n1,0.1,9.6,,1.0,1\n2,0.1,9.5,9.4,2.0,0\n")
    for arm, seed in (("fp32", 0), ("fp16-compact", 3)):
        folder = tmp_path / setting.name / "cpu" / arm / f"seed-{seed}"
        folder.mkdir(parents=True)
        (folder / "log.csv").write_text(log)
    rows = training.collect(tmp_path, setting)
    assert set(zip(rows["arm"], rows["seed"], strict=True)) == {("fp32", 0), ("fp16 compact", 3)}
    heldout = rows[(rows["arm"] == "fp16 compact") & (rows["split"] == "heldout")]
    assert list(heldout["step"]) == [0, 2] and list(heldout["skipped_steps"]) == [0, 1]
    assert set(rows["split"]) == {"train", "heldout"}  # a log from before the buckets: no bucket rows
    assert training.collect(tmp_path, setting, device="cuda").empty


def test_collect_emits_the_per_bucket_heldout_losses_with_the_arms_chunking(tmp_path):
    log = ("step,learning_rate,train_loss,heldout_loss,elapsed_s,skipped,heldout_frequent,heldout_middle,heldout_rare\n"
           "0,,,9.7,0.0,,9.1,9.8,10.5\n1,0.1,9.6,,1.0,0,,,\n2,0.1,9.5,9.4,2.0,0,8.0,9.9,11.0\n")
    for arm in ("fp32", "bf16-compact"):
        folder = tmp_path / "long" / "cpu" / arm / "seed-0"
        folder.mkdir(parents=True)
        (folder / "log.csv").write_text(log)
    rows = training.collect(tmp_path, LONG)
    compact = rows[rows["arm"] == "bf16 compact"].set_index(["split", "step"])["loss"]
    assert compact[("heldout:frequent", 2)] == 8.0 and compact[("heldout:rare", 0)] == 10.5
    assert compact[("heldout", 2)] == 9.4 and ("heldout:middle", 1) not in compact.index
    assert set(rows.loc[rows["arm"] == "bf16 compact", "chunking"]) == {f"rows:{LONG.batch_rows // 256}"}
    assert set(rows.loc[rows["arm"] == "fp32", "chunking"]) == {""} and set(rows["batch_rows"]) == {LONG.batch_rows}
    buckets = training.bucket_rows(rows)
    assert set(buckets["split"]) == set(training.BUCKET_SPLITS) and len(buckets) == 2 * 2 * 3
    assert (buckets["split"] == "heldout:" + buckets["bucket"]).all()
    # the per-bucket rows leave the gaps on the mean held-out loss as they were
    plain = rows[~rows["split"].isin(training.BUCKET_SPLITS)]
    pd.testing.assert_frame_equal(training.final_losses(rows), training.final_losses(plain))


def test_the_long_setting_trains_fp32_and_bf16_balanced_and_compact_in_256_chunks():
    assert [arm.name for arm in LONG.arms] == ["fp32", "bf16 balanced", "bf16 compact"]
    assert LONG.steps >= 3000 and 0 in LONG.seeds and LONG.eval_every == 100 and LONG.eval_windows == 16
    assert LONG.snapshot_steps == ()  # no checkpoint errors to compute after it
    hidden = torch.empty(LONG.batch_rows, 128, dtype=torch.bfloat16)
    weight = torch.empty(16384, 128, dtype=torch.bfloat16)
    for arm in LONG.arms[1:]:
        plan = lce.plan(hidden, weight, options=training.arm_options(arm))
        assert plan.num_chunks == 256 and plan.acc_policy == arm.policy, arm
    with pytest.raises(ValueError, match="multiple of chunks"):
        training.chunked_arms(["bf16 compact"], 1000, 256)


def test_bucket_edges_are_written_beside_the_runs_and_read_back(tmp_path):
    tokens = torch.tensor([0] * 6 + [1] * 3 + [2])  # 60%, 30%, 10% of the targets; class 3 never seen
    path = training.write_bucket_edges(tmp_path, tokens, vocab_size=4)
    assert json.loads(path.read_text())["train_tokens"] == 10
    edges = training.bucket_edges_of(path)
    assert list(edges["classes"]) == [1, 1, 2]
    assert list(edges["target_share"]) == pytest.approx([0.6, 0.3, 0.1])
    assert list(edges["min_count"]) == [6, 3, 0] and list(edges["max_count"]) == [6, 3, 1]
    (tmp_path / "training_x_buckets.json").write_text(path.read_text())
    assert edges.equals(training.bucket_edges_of(tmp_path / "training_x.csv"))
