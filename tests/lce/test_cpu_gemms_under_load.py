"""lce.cpu_gemms' verdict in fresh processes at 1, 2 and all threads, with the other cores idle and with every core
busy, natively and under the AVX2 stand-in (oneDNN, MKL and ATen capped at AVX2, so this CPU emulates bf16 and
fp16 GEMMs as an AVX2-only one does).

The case these reproduce: an AVX2-only EPYC under ``pytest -n auto`` called its emulated bf16 GEMMs native with
2 threads and one core busy elsewhere, because a small 2-thread fp32 product waited on a thread without a core
(issue 29). Every check below runs in a new interpreter, as a user's process or a sweep worker decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from analysis.studies.cpu_kinds import AVX2_STAND_IN, AVX512F_STAND_IN
from analysis.studies.cpu_probe import every_core_busy

pytestmark = pytest.mark.slow

# In a fresh interpreter: the uncached decision at each thread count, then the plan (bf16 4096x512x32768,
# balanced with an fp32 accumulator) at 2 threads through the cached path lce.plan uses.
_SCRIPT = """
import json, os, torch, lce, lce.cpu_gemms as c
rows = []
for threads in sorted({1, 2, os.cpu_count()}):
    torch.set_num_threads(threads)
    for dtype in c.LOW_PRECISION:
        support = c.measure(dtype)
        rows.append([threads, support.dtype_name, support.support, support.source, support.slowdown])
torch.set_num_threads(2)
x = torch.empty(4096, 512, dtype=torch.bfloat16, requires_grad=True)
w = torch.empty(32768, 512, dtype=torch.bfloat16, requires_grad=True)
plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32))
gemms = {name: str(plan.gemm_dtypes(name).operands) for name in ("logits", "grad_input", "grad_weight")}
print(json.dumps({"rows": rows, "plan_gemms": gemms, "plan_text": str(plan)}))
"""


def _decide(stand_in: bool | dict[str, str], busy: bool) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "LCE_CPU_GEMMS"}
    if stand_in:
        environment.update(AVX2_STAND_IN if stand_in is True else stand_in)
    with every_core_busy() if busy else contextlib.nullcontext():
        done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=environment,
                              timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("load", ["idle", "busy"])
def test_under_the_avx2_stand_in_bf16_and_fp16_are_emulated_at_every_thread_count_and_load(load):
    decided = _decide(stand_in=True, busy=load == "busy")
    for threads, dtype, support, source, slowdown in decided["rows"]:
        assert support == "emulated", f"{dtype} at {threads} threads, {load}: {support} ({source}, {slowdown}x)"
    # the plan runs fp32 GEMMs where balanced would have run bf16 ones on a native CPU
    assert set(decided["plan_gemms"].values()) == {"torch.float32"}, decided["plan_text"]
    assert "bfloat16 emulated on this CPU" in decided["plan_text"]


def _has_avx512bw() -> bool:
    from lce.cpu_gemms import cpu_flags

    flags = cpu_flags()
    return flags is not None and "avx512bw" in flags


@pytest.mark.skipif(not _has_avx512bw(), reason="the AVX512F stand-in only narrows a CPU's instruction set: it needs a "
                                                "CPU with AVX512-BW to stand for one (an AVX2-only CPU emulates bf16)")
@pytest.mark.parametrize("load", ["idle", "busy"])
def test_under_the_avx512f_stand_in_bf16_is_slow_and_the_plan_runs_fp32_gemms(load):
    """The AVX512F Xeon's kind: bf16 GEMMs with a kernel, but about 0.2x fp32's rate (issue 30)."""
    decided = _decide(stand_in=AVX512F_STAND_IN, busy=load == "busy")
    for threads, dtype, support, source, slowdown in decided["rows"]:
        expected = "slow" if dtype == "bfloat16" else "emulated"
        assert support == expected, f"{dtype} at {threads} threads, {load}: {support} ({source}, {slowdown}x)"
    assert set(decided["plan_gemms"].values()) == {"torch.float32"}, decided["plan_text"]
    assert "bfloat16 slow on this CPU" in decided["plan_text"]


def test_natively_the_verdict_is_the_same_at_every_thread_count_idle_and_busy():
    idle, busy = _decide(stand_in=False, busy=False), _decide(stand_in=False, busy=True)
    verdicts = {(dtype, support) for _, dtype, support, _, _ in idle["rows"] + busy["rows"]}
    assert len(verdicts) == 2, f"the verdict depends on the thread count or the load: {idle['rows']} {busy['rows']}"
    assert idle["plan_gemms"] == busy["plan_gemms"]
