"""lce.planning.cpu_gemms: this CPU's bf16/fp16 GEMMs native or emulated, and what plans, lce.passes.gemm and
lce.recommend do with it.

Every test plans as on a CPU with native bf16/fp16 GEMMs (tests/conftest.py), so that plans are the same on every
CPU kind; these tests drive each branch with :func:`lce.testing.cpu_gemms` and check the probe itself.
"""

from __future__ import annotations

import pytest
import torch

import lce
import lce.planning.blocks
import lce.planning.cpu_gemms
from helpers import F64, Case, make_problem, ref_run, rel_err, run
from lce.passes.gemm import add_mm_, mm
from lce.planning.blocks import in_fp32_blocks
from lce.planning.cpu_gemms import (
    EMULATED_SLOWDOWN,
    ENV_VAR,
    SLOW_SLOWDOWN,
    GemmSupport,
    gemm_support,
    parse_setting,
    probe,
)
from lce.testing import cpu_gemms

GEMMS = ("logits", "grad_input", "grad_weight")


def _plan(options, dtype=torch.bfloat16, shape=(64, 32, 512)):
    n, d, c = shape
    x = torch.zeros(n, d, dtype=dtype, requires_grad=True)
    w = torch.zeros(c, d, dtype=dtype, requires_grad=True)
    return lce.plan(x, w, options=options)


# ---- the probe and the settings --------------------------------------------------------------------------

# /proc/cpuinfo flags of the CPU kinds this project runs on (the lines, less flags no rule reads)
AVX2_EPYC = frozenset(("fpu sse sse2 ssse3 sse4_1 sse4_2 fma f16c avx avx2 bmi1 bmi2 aes sha_ni popcnt movbe rdrand "
                       "rdseed adx clflushopt clwb xsaveopt xsavec hypervisor").split())
AVX512F_XEON = AVX2_EPYC | {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni"}
AVX512_BF16_EPYC = AVX512F_XEON | {"avx512_bf16", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg"}
AMX_XEON = AVX512_BF16_EPYC | {"avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_probe_decides_once_per_process_by_the_flags_or_a_timed_check(dtype):
    first = probe(dtype)
    assert first is probe(dtype)  # cached: decided once per process
    if first.source == "cpu flags":  # this CPU has no fast kernel for the dtype: nothing timed
        assert first.slower_than_fp32 and first.slowdown is None
    else:
        assert first.source == "measured" and first.slowdown > 0
        assert first.emulated == (first.slowdown > EMULATED_SLOWDOWN)
        assert first.slower_than_fp32 == (first.slowdown > SLOW_SLOWDOWN)
        assert str(first).startswith(f"{first.dtype_name} {first.support} (measured: ")


@pytest.mark.parametrize(("flags", "bf16", "fp16"), [
    (AVX2_EPYC, "emulated", "emulated"),
    (AVX512F_XEON, "slow", "emulated"),  # AVX512BW's converting bf16 kernel only
    (AVX512_BF16_EPYC, None, "emulated"),
    (AMX_XEON, None, None),
    (AVX2_EPYC | {"avx_ne_convert"}, None, None),
    (None, None, None),  # flags unknown (not x86 Linux): only a timed check can tell
], ids=["avx2-epyc", "avx512f-xeon", "avx512-bf16-epyc", "amx-xeon", "avx-ne-convert", "unknown"])
def test_the_flags_rule_out_a_kernel_only_where_the_cpu_has_none_of_its_instructions(flags, bf16, fp16):
    assert lce.planning.cpu_gemms.flags_verdict(torch.bfloat16, flags) == bf16
    assert lce.planning.cpu_gemms.flags_verdict(torch.float16, flags) == fp16


def test_on_an_avx2_only_cpu_the_flags_decide_and_nothing_is_timed(monkeypatch):
    def no_timing(dtype):
        raise AssertionError("the flags rule the kernel out: nothing should be timed")

    monkeypatch.setattr(lce.planning.cpu_gemms, "_one_thread_slowdown", no_timing)
    for dtype in (torch.bfloat16, torch.float16):
        support = lce.planning.cpu_gemms.measure(dtype, flags=AVX2_EPYC)
        assert (support.support, support.source, support.slowdown) == ("emulated", "cpu flags", None)
        assert str(support) == f"{support.dtype_name} emulated (cpu flags)"


def test_on_an_avx512f_xeon_the_flags_say_slow_bf16_and_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(lce.planning.cpu_gemms, "_one_thread_slowdown", lambda dtype: pytest.fail("nothing should be "
                                                                                                  "timed"))
    support = lce.planning.cpu_gemms.measure(torch.bfloat16, flags=AVX512F_XEON)
    assert (support.support, support.source, support.slowdown) == ("slow", "cpu flags", None)
    assert support.slower_than_fp32 and not support.emulated
    assert lce.planning.cpu_gemms.rate_vs_fp32(support, AVX512F_XEON) == lce.planning.cpu_gemms.FLAGGED_SLOW_RATE


@pytest.mark.parametrize(("slowdown", "expected"), [(0.8, "native"), (1.7, "native"), (4.5, "slow"), (11.0, "slow"),
                                                    (23.0, "emulated")])
def test_where_the_flags_allow_a_kernel_the_timed_check_decides(monkeypatch, slowdown, expected):
    monkeypatch.setattr(lce.planning.cpu_gemms, "_one_thread_slowdown", lambda dtype: slowdown)
    support = lce.planning.cpu_gemms.measure(torch.bfloat16, flags=AMX_XEON)
    assert (support.support, support.source, support.slowdown) == (expected, "measured", slowdown)


def test_the_timed_check_runs_on_one_thread_and_restores_the_thread_count(monkeypatch):
    seen = []
    real = lce.planning.cpu_gemms._seconds
    monkeypatch.setattr(lce.planning.cpu_gemms, "_seconds",
                        lambda a, b: (seen.append(torch.get_num_threads()), real(a, b))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lce.planning.cpu_gemms.measure(torch.bfloat16, flags=None)
        assert set(seen) == {1} and len(seen) >= 6  # at least three interleaved rounds
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("support", "flags", "rate"), [
    (GemmSupport(torch.bfloat16, "native", "measured", 0.8), AMX_XEON, 2.5),  # the flags name the kernel's rate
    (GemmSupport(torch.bfloat16, "native", "measured", 0.8), AVX512_BF16_EPYC, 1.5),
    (GemmSupport(torch.float16, "native", "measured", 1.5), AMX_XEON, 1.0),
    (GemmSupport(torch.bfloat16, "slow", "measured", 4.0), AMX_XEON, 0.25),  # timed: 1 / slowdown
    (GemmSupport(torch.bfloat16, "emulated", "measured", 40.0), AMX_XEON, 0.025),
    (GemmSupport(torch.bfloat16, "emulated", "cpu flags"), AVX2_EPYC, 1 / 80),
    (GemmSupport(torch.float32, "native", "always"), None, 1.0),
    (GemmSupport(torch.bfloat16, "native", "lce.testing.cpu_gemms"), AMX_XEON, 2.0),  # set, not measured
    (GemmSupport(torch.bfloat16, "native", "LCE_CPU_GEMMS"), None, 2.0),
])
def test_the_rate_over_fp32_is_continuous_from_the_check_or_the_flags(support, flags, rate):
    assert lce.planning.cpu_gemms.rate_vs_fp32(support, flags) == pytest.approx(rate)


def test_measure_rejects_a_dtype_that_is_never_emulated():
    with pytest.raises(ValueError, match=r"dtype must be one of .*got torch.float32"):
        lce.planning.cpu_gemms.measure(torch.float32)


def test_a_worker_adopts_its_parents_verdicts_below_the_override(monkeypatch):
    monkeypatch.setattr(lce.planning.cpu_gemms, "_ADOPTED", {})
    monkeypatch.setattr(lce.planning.cpu_gemms, "_environment_setting", lambda: parse_setting("native"))
    parent = {torch.bfloat16: lce.planning.cpu_gemms.GemmSupport(torch.bfloat16, "emulated", "measured", 24.0),
              torch.float16: lce.planning.cpu_gemms.GemmSupport(torch.float16, "emulated", "cpu flags")}
    token = lce.planning.cpu_gemms.CPU_GEMMS_OVERRIDE.set(None)  # lift the suite's own pin (tests/conftest.py)
    try:
        lce.planning.cpu_gemms.adopt(parent)
        assert lce.planning.cpu_gemms.verdicts() == parent  # above the environment's "native"
        assert lce.planning.cpu_gemms.describe() == "bfloat16 emulated, float16 emulated (cpu flags)"
        with cpu_gemms("native"):
            assert not gemm_support(torch.bfloat16).emulated
    finally:
        lce.planning.cpu_gemms.CPU_GEMMS_OVERRIDE.reset(token)


@pytest.mark.parametrize("verdicts", [{torch.float32: None}, {torch.bfloat16: "emulated"},
                                      {torch.bfloat16: GemmSupport(torch.float16, "native", "x")}])
def test_adopt_rejects_what_verdicts_cannot_have_returned(verdicts):
    with pytest.raises(ValueError, match="parent_verdicts must map each of"):
        lce.planning.cpu_gemms.adopt(verdicts)


def test_fp32_and_fp64_gemms_are_native_without_a_probe():
    for dtype in (torch.float32, torch.float64):
        assert gemm_support(dtype).support == "native" and gemm_support(dtype).slowdown is None


@pytest.mark.parametrize(("text", "expected"), [
    ("native", {torch.bfloat16: "native", torch.float16: "native"}),
    ("emulated", {torch.bfloat16: "emulated", torch.float16: "emulated"}),
    (" bfloat16=emulated , float16=native ", {torch.bfloat16: "emulated", torch.float16: "native"}),
    ("float16=emulated", {torch.float16: "emulated"}),
    ("", {}),
])
def test_the_environment_setting_is_parsed(text, expected):
    assert parse_setting(text) == expected


@pytest.mark.parametrize("text", ["fast", "bfloat16", "bfloat16=fast", "float32=native", "bf16=native"])
def test_a_bad_environment_setting_names_the_variable_and_the_choices(text):
    with pytest.raises(ValueError, match=rf"{ENV_VAR}=.*{text.split('=')[0]}.*expected 'native', 'emulated'"):
        parse_setting(text)


def test_the_environment_variable_decides_unless_the_override_is_set(monkeypatch):
    monkeypatch.setattr(lce.planning.cpu_gemms, "_environment_setting", lambda: parse_setting("bfloat16=emulated"))
    token = lce.planning.cpu_gemms.CPU_GEMMS_OVERRIDE.set(None)  # lift the suite's own pin (tests/conftest.py)
    try:
        assert gemm_support(torch.bfloat16).support == "emulated" and gemm_support(torch.bfloat16).source == ENV_VAR
        # not named: lce decides, by the CPU's flags where they rule a kernel out (AVX2-only parts), else timed
        assert gemm_support(torch.float16).source in ("measured", "cpu flags")
        with cpu_gemms("native"):
            assert gemm_support(torch.bfloat16).support == "native"
            assert gemm_support(torch.bfloat16).source == "lce.testing.cpu_gemms"
            with cpu_gemms({torch.bfloat16: "emulated"}):
                assert gemm_support(torch.bfloat16).emulated
            assert not gemm_support(torch.bfloat16).emulated
        assert gemm_support(torch.bfloat16).emulated
    finally:
        lce.planning.cpu_gemms.CPU_GEMMS_OVERRIDE.reset(token)


@pytest.mark.parametrize("support", ["fast", {torch.float32: "native"}, {torch.bfloat16: "sluggish"}])
def test_the_override_rejects_what_it_cannot_mean(support):
    with pytest.raises(ValueError, match="support must be one of"), cpu_gemms(support):
        pass


def test_provenance_describes_both_dtypes():
    with cpu_gemms({torch.bfloat16: "emulated", torch.float16: "native"}):
        assert lce.planning.cpu_gemms.describe() == ("bfloat16 emulated (lce.testing.cpu_gemms), "
                                            "float16 native (lce.testing.cpu_gemms)")


# ---- plans -----------------------------------------------------------------------------------------------

def test_native_bf16_keeps_balanced_backward_gemms_in_bf16_and_says_so():
    with cpu_gemms("native"):
        plan = _plan(lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32))
    assert plan.gemm_dtypes("grad_input").operands == torch.bfloat16
    assert not any(plan.gemm_in_fp32(name) for name in GEMMS)
    assert "  cpu gemms  bfloat16 native on this CPU (lce.testing.cpu_gemms)\n" in str(plan)


@pytest.mark.parametrize("support", ["slow", "emulated"])
@pytest.mark.parametrize("policy", ["balanced", "compact"])
def test_slow_or_emulated_bf16_runs_the_narrow_gemms_of_a_wide_acc_layout_in_fp32(policy, support):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32)
    with cpu_gemms(support):
        plan = _plan(options)
        accurate = _plan(lce.LinearCrossEntropyOptions(acc_policy="accurate", acc_dtype=torch.float32))
    assert plan.layout == accurate.layout
    assert all(plan.gemm_dtypes(name) == (torch.float32, torch.float32) for name in GEMMS)
    assert plan.acc_policy == policy  # the policy asked for; its layout is what runs
    said = "emulated on this CPU" if support == "emulated" else "slower than fp32's on this CPU"
    assert any(said in note and "run in acc_dtype" in note for note in plan.notes)
    assert plan.peak_extra_bytes == accurate.peak_extra_bytes


@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
def test_emulated_bf16_with_a_bf16_accumulator_keeps_bf16_results_computed_on_fp32_copies(policy):
    with cpu_gemms("emulated"):
        # explicit policy: acc_dtype = bf16; a weight of 2M elements, two blocks' worth
        plan = _plan(lce.LinearCrossEntropyOptions(acc_policy=policy), shape=(64, 256, 8192))
    assert plan.acc_dtype == torch.bfloat16
    assert all(plan.gemm_dtypes(name) == (torch.bfloat16, torch.bfloat16) for name in GEMMS)
    assert all(plan.gemm_in_fp32(name) for name in GEMMS)
    assert "bfloat16 emulated on this CPU (lce.testing.cpu_gemms); lce runs the bfloat16 GEMMs on fp32 copies" in str(
        plan)
    # its memory: bf16 buffers plus fp32 blocks, never a (C, D) fp32 copy of the weight
    c, d = plan.num_classes, plan.in_features
    assert all(b.nbytes < c * d * 4 for b in plan.buffers if b.name.endswith("_fp32"))


def test_auto_picks_are_the_same_on_both_kinds():
    """CPU "auto" bf16 and fp16 run every GEMM in fp32 already: the capability changes nothing but the note."""
    for dtype in (torch.bfloat16, torch.float16):
        with cpu_gemms("native"):
            native = _plan(lce.LinearCrossEntropyOptions(), dtype)
        with cpu_gemms("emulated"):
            emulated = _plan(lce.LinearCrossEntropyOptions(), dtype)
        assert native.layout == emulated.layout and native.acc_policy == emulated.acc_policy == "accurate"
        assert native.batch_chunk_size == emulated.batch_chunk_size
        assert native.peak_extra_bytes == emulated.peak_extra_bytes


def test_fp32_input_and_meta_tensors_have_no_cpu_gemms_line():
    assert _plan(lce.LinearCrossEntropyOptions(), torch.float32).cpu_gemms is None
    x = torch.empty(8, 4, dtype=torch.bfloat16, device="meta")
    plan = lce.plan(x, torch.empty(16, 4, dtype=torch.bfloat16, device="meta"), options=lce.LinearCrossEntropyOptions())
    assert plan.cpu_gemms is None and "cpu gemms" not in str(plan)


# ---- the numbers: the emulated branch computes what the native one does ----------------------------------

@pytest.mark.parametrize(("m", "k", "n"), [(24, 28, 320), (24, 320, 28), (5, 3000, 7), (7, 9, 2500)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_gemm_in_fp32_is_the_exact_product_rounded_once(monkeypatch, m, k, n, dtype):
    """Each block's products are exact in fp32; only the fp32 summation order and the one rounding remain."""
    monkeypatch.setattr(lce.planning.blocks, "_BLOCK_ELEMENTS", 64 * 28)  # several blocks along either axis
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)
    exact = a.double() @ b.double()
    assert in_fp32_blocks(m, k, n).size < max(k, n)
    out = torch.empty(m, n, dtype=dtype)
    for got in (mm(a, b, dtype, in_fp32=True), mm(a, b, dtype, out=out, in_fp32=True),
                mm(a, b, dtype, alpha=0.25, in_fp32=True) * 4):
        assert got.dtype == dtype
        # within one rounding of the exact product (plus fp32 sums of k terms, far below it)
        assert torch.all((got.double() - exact).abs() <= exact.abs() * 2 * torch.finfo(dtype).eps + 1e-6 * k)
    target = torch.randn(k, n, generator=g).to(dtype)
    wide = target.double() + a.T.double() @ a.double()[:, :n] if k >= 1 and n <= k else None
    if wide is not None:
        add_mm_(target, a.T.contiguous(), a[:, :n].contiguous(), dtype, in_fp32=True)
        assert torch.all((target.double() - wide).abs() <= wide.abs() * 2 * torch.finfo(dtype).eps + 1e-6 * m)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
def test_the_emulated_branch_is_as_accurate_as_the_native_one(policy, reduction):
    """Against fp64 of the same bf16 leaves: a bf16 accumulator's error (GEMMs on fp32 copies) is the native
    bf16 GEMMs' error; a wide accumulator runs accurate's numbers, bit for bit."""
    case = Case(N=48, D=24, V=300, reduction=reduction, bias=True)
    problem = make_problem(case, dtype=torch.bfloat16)
    exact = ref_run(problem.replace(input=problem.input.to(F64), linear_weight=problem.linear_weight.to(F64),
                                    linear_bias=problem.linear_bias.to(F64),
                                    grad_output=None if problem.grad_output is None else problem.grad_output.to(F64)))
    for acc_dtype in (None, torch.float32):
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                                batch_chunk_size=16)
        with cpu_gemms("native"):
            native = run(lce.linear_cross_entropy, problem, options=options)
        with cpu_gemms("emulated"):
            emulated = run(lce.linear_cross_entropy, problem, options=options)
            accurate = run(lce.linear_cross_entropy, problem, options=lce.LinearCrossEntropyOptions(
                acc_policy="accurate", acc_dtype=acc_dtype, chunking_method=None, batch_chunk_size=16))
        for name in ("input", "linear_weight", "linear_bias"):
            native_error = rel_err(native[1][name], exact[1][name])
            emulated_error = rel_err(emulated[1][name], exact[1][name])
            assert emulated_error <= 1.25 * native_error + 1e-3, (name, acc_dtype, emulated_error, native_error)
            if acc_dtype is not None:
                assert torch.equal(emulated[1][name], accurate[1][name]), name
        assert rel_err(emulated[0], exact[0]) <= 1.25 * rel_err(native[0], exact[0]) + 1e-3


# ---- recommend -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("support", ["slow", "emulated"])
def test_recommend_picks_bf16_gemms_only_where_they_are_native(support):
    """The issue's case: 1024x128x8192 bf16, no budget. With native bf16 GEMMs the time model prefers a layout
    that runs some; with slow or emulated ones, no GEMM of the pick runs in bf16 on the CPU's own kernel."""
    shape = (1024, 128, 8192)
    with cpu_gemms("native"):
        native = lce.recommend(*shape, torch.bfloat16, "cpu")
    with cpu_gemms(support):
        emulated = lce.recommend(*shape, torch.bfloat16, "cpu")
    assert any(native.plan.gemm_dtypes(name).operands == torch.bfloat16 for name in GEMMS), native.explain()
    assert not any(emulated.plan.gemm_dtypes(name).operands == torch.bfloat16 and not emulated.plan.gemm_in_fp32(name)
                   for name in GEMMS), emulated.explain()
    assert emulated.chosen.seconds >= native.chosen.seconds
    assert f"bfloat16 GEMMs {support} on this CPU" in emulated.explain()
    assert "bfloat16 GEMMs native on this CPU" in native.explain()


def test_a_narrow_weight_gradient_sum_is_accumulated_on_fp32_blocks_on_any_cpu():
    """compact with acc_dtype = bf16 adds each chunk's product into the bf16 gradient. A CPU without native bf16
    accumulation (measured: an Intel Xeon with AVX512F but neither AVX512-BF16 nor AMX) makes an fp32 copy of the
    whole (C, D) target inside torch's own addmm_ (a 16 MiB temporary at 16384x256, per chunk), so lce adds a
    block of rows at a time on fp32 copies on every CPU: native bf16 otherwise, the same single rounding."""
    x = torch.randn(64, 256).bfloat16().requires_grad_(True)
    w = torch.randn(8192, 256).bfloat16().requires_grad_(True)
    with cpu_gemms("native"):
        plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy="compact", batch_chunk_size=16))
        balanced = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32,
                                                                        batch_chunk_size=16))
    assert [plan.gemm_in_fp32(name) for name in ("logits", "grad_input", "grad_weight")] == [False, False, True]
    assert "lce runs the bfloat16 grad_weight GEMM on fp32 copies" in str(plan)
    assert not any(balanced.gemm_in_fp32(name) for name in ("logits", "grad_input", "grad_weight"))
    assert any(buffer.name == "weight_grad_block_fp32" for buffer in plan.buffers)
