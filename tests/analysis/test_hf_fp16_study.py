"""The fp16 GradScaler training run (analysis.studies.hf_fp16) at its quick setting: arms train, agree with each
other, the rows are resumable and carry provenance."""

from __future__ import annotations

import pytest
import torch

from analysis.core.results_io import read_table
from analysis.studies import hf_fp16 as study

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # fp16 autocast GEMMs are emulated on some CPU kinds


def test_the_chain_is_stochastic_and_zipfian():
    chain = study.bigram_chain(study.QUICK, 0)
    assert torch.allclose(chain.sum(1), torch.ones(study.QUICK.vocab, dtype=torch.float64))
    marginal = chain.mean(0)
    assert marginal[:10].sum() > 10 * marginal[-10:].sum()  # the first tokens are far more likely


def test_lce_under_fp16_autocast_and_a_grad_scaler_trains_as_the_unpatched_model(tmp_path):
    arms = ("fp32", "unpatched", "lce cuda-layouts")
    path, _ = study.record(tmp_path, "hf.csv", setting=study.QUICK, arms=arms, seeds=(0,), progress=False)
    table = read_table(path)
    assert set(table["arm"]) == set(arms) and table["finite"].astype(bool).all()
    assert table["git_revision"].notna().all() and (table["steps"] == study.QUICK.steps).all()
    last = table[table["step"] == study.QUICK.steps].set_index("arm")
    first = table[table["step"] == study.QUICK.every].set_index("arm")
    assert (last["heldout_loss"] < first["heldout_loss"]).all()  # it learns
    assert abs(last.loc["lce cuda-layouts", "heldout_loss"] - last.loc["unpatched", "heldout_loss"]) < 1e-2
    assert last.loc["unpatched", "loss_scale"] == 2.0 ** 16  # the scale reached 2**16 without an overflow
    study.record(tmp_path, "hf.csv", setting=study.QUICK, arms=arms, seeds=(0,), progress=False)
    assert len(read_table(path)) == len(table)  # done runs are not trained twice
    with pytest.raises(ValueError, match="arm must be one of"):
        study.train_arm("lce fast", study.QUICK, 0)
