"""The fp16 training run of a transformers Llama under a GradScaler (``python -m analysis hf-fp16``): each arm's
held-out gap to the fp32 run of the same seed, with intervals, and the README block. Nothing here measures."""

from __future__ import annotations

import pandas as pd

from analysis.judge.horizon import interval_table
from analysis.report.tables import markdown_table

__all__ = ["final_gaps", "readme_hf_fp16"]


def final_gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Per arm (fp32 left out) at the last step: the mean held-out gap to the fp32 run of the same seed, its
    interval over seeds, whether it counts (systematic and beyond the fp32 runs' spread over seeds), and the
    arm's skipped steps and final loss scale (their range over seeds)."""
    last = table[table["step"] == table["step"].max()]
    fp32 = last[last["arm"] == "fp32"].set_index("seed")["heldout_loss"]
    rows = last[last["arm"] != "fp32"].assign(fp32=lambda r: r["seed"].map(fp32), optimizer="adamw", bucket="all")
    rows = rows.assign(gap=rows["heldout_loss"] - rows["fp32"])
    gaps = interval_table(rows, ["optimizer", "arm", "bucket", "step"])
    extra = rows.groupby("arm", sort=False).agg(skipped_low=("skipped_steps", "min"),
                                                skipped_high=("skipped_steps", "max"),
                                                scale_low=("loss_scale", "min"), scale_high=("loss_scale", "max"),
                                                finite=("finite", lambda v: bool(v.astype(bool).all())),
                                                heldout=("heldout_loss", "mean"))
    return gaps.join(extra, on="arm")


def readme_hf_fp16(results) -> str:
    """The README's "hf-fp16" block."""
    from analysis.core.results_io import read_table
    from analysis.studies.hf_fp16 import HF_FP16_FILE

    path = results / HF_FP16_FILE  # the full run only, not --quick's file
    table = read_table(path) if path.exists() else pd.DataFrame()
    if table.empty:
        return "The fp16 training run has not been made yet (`python -m analysis hf-fp16`).\n"
    final = final_gaps(table)
    first = table.iloc[0]
    out = pd.DataFrame({
        "arm": final["arm"], "seeds": final["seeds"],
        "held-out loss (nats)": [f"{v:.4f}" for v in final["heldout"]],
        "gap to fp32 (mnats)": [f"{1e3 * r.gap:+.2f} [{1e3 * r.low:+.2f}, {1e3 * r.high:+.2f}]"
                                for r in final.itertuples()],
        "skipped steps": [f"{r.skipped_low}–{r.skipped_high}" if r.skipped_low != r.skipped_high
                          else f"{r.skipped_low}" for r in final.itertuples()],
        "final loss scale": [f"2^{int(r.scale_low).bit_length() - 1}" if r.scale_low == r.scale_high
                             else f"2^{int(r.scale_low).bit_length() - 1}–2^{int(r.scale_high).bit_length() - 1}"
                             for r in final.itertuples()]})
    return (f"fp16 training through `lce.integrations.transformers` (`python -m analysis hf-fp16`): a Llama of "
            f"{int(first['layers'])} layers, {int(first['hidden'])} features and {int(first['vocab'])} tokens, "
            f"{int(first['batch'])}x{int(first['seq_len'])} tokens per step from a Zipfian bigram chain, "
            f"{int(table['step'].max())} AdamW steps under `torch.autocast(\"cpu\", dtype=torch.float16)` and "
            f"`torch.amp.GradScaler` at its defaults (fp32: neither), {first['cpu_model']}, torch "
            f"{first['torch_version']}; held-out loss at the last step, gap to the fp32 run of the same seed with "
            f"its 95% t-interval over seeds (each seed draws its own chain, start and batches)."
            f"\n\n{markdown_table(out)}")
