"""python -m analysis gpu-check: the dry run CI executes, the budget's shares, the wheels, the cuda grid's order."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from analysis.core.fp64 import REFERENCE_BLOCK_ELEMENTS
from analysis.core.implementations import float32_matmul_precision, meta_plan, tensor_device
from analysis.core.results_io import file_kind
from analysis.gpu import check, wheels
from analysis.judge.pareto import _devices_for
from analysis.paths import RESULTS_DIR, ROOT
from analysis.report import nb04_pareto
from analysis.sweep.grids import CUDA_FAMILY_SHAPE, CUDA_HEADLINE_SHAPES, FAMILIES_IN_GRIDS, get_grid
from analysis.sweep.run import reference_block_elements
from lce.decide.error_model import predict_errors


@pytest.mark.slow
def test_the_dry_run_plans_every_step_and_runs_the_emulated_grid(tmp_path):
    steps = ("smoke", "bench", "memory", "tests", "grid")  # the default steps and the two that are opt-in now
    result = subprocess.run([sys.executable, "-m", "analysis", "gpu-check", "--dry-run", "--out", str(tmp_path),
                             "--wheels", str(tmp_path / "no-wheels"), "--steps", ",".join(steps)], cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (tmp_path / "gpu_check.log").read_text()
    for name in steps:
        assert f"== step {name}: exit 0" in log
    assert "== step noise" not in log  # opt-in steps run only when --steps names them
    assert "wheel liger-kernel: MISSING" in log and "wheel cut-cross-entropy: MISSING" in log
    assert "git_revision: " in log and "torch: " + torch.__version__ in log
    assert "planned: " in log  # the real grid's problems, each with an estimate
    for shape in check.MEMORY_SHAPES:
        assert f"{shape} bf16:" in log  # lce's plan at the LLM heads, on meta tensors
    assert {file_kind(tmp_path / name) for name in ("cuda.csv", "gpu_memory.csv", "gpu_bench.csv")} == {
        "sweep", "gpu_memory", "gpu_bench"}
    assert "== step head" not in log and not (tmp_path / "head_training_cuda.csv.gz").exists()  # opt-in
    grid = pd.read_csv(tmp_path / "cuda.csv")
    assert set(grid["status"]) == {"ok"} and set(grid["device"]) == {"cuda-emulated"}
    assert set(grid["family"]) == set(FAMILIES_IN_GRIDS)
    assert set(grid["policy"]) == {"auto", "accurate", "balanced", "compact"}
    bench = pd.read_csv(tmp_path / "gpu_bench.csv")
    assert set(bench["family"]) == {"random", "random-bias"}  # each head without a bias and with one
    by_op = bench.groupby("op")["status"].agg(set)
    assert by_op["liger"] == {"skipped"} and by_op["compiled"] == {"not run"} and by_op["lce"] == {"ok"}
    assert (bench.loc[bench["op"] == "reference", "grad_weight_fro_in_floors"] >= 1.0).all()
    assert any(note.startswith("bitwise repeatable") for note in bench["note"].dropna())  # lce's default, twice
    assert bench.loc[bench["op"] == "lce", "note"].str.contains("passes: PyTorch ops").all()  # the backend that ran
    compiled = bench.index[bench["op"] == "compiled"]
    assert compiled.min() > bench.index[bench["op"] != "compiled"].max()  # torch.compile last, after every head
    # the smoke step ran what a GPU's would: every kernel variant compiled (sm_90 here), lce with the kernels
    assert f"kernel variants compiled for sm_{check.SMOKE_ARCH_WITHOUT_GPU}" in log and "smoke: 0 failure(s)" in log
    assert "smoke: lce default on cpu: ok" in log and "two fused Triton kernels per step" in log


def test_step_shares_leave_room_and_bad_budgets_are_named():
    shares = check.step_seconds(420)
    assert list(shares) == list(check.DEFAULT_STEPS) == ["smoke", "bench", "tests"]
    assert 0.9 * 420 <= sum(shares.values()) < 420
    chosen = check.step_seconds(420, ["train", "noise"])
    assert list(chosen) == ["noise", "train"]  # the fixed run order, whatever the order asked
    assert chosen["train"] > chosen["noise"] and 0.9 * 420 <= sum(chosen.values()) < 420
    for bad in (0, -5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget_s"):
            check.step_seconds(bad)
    with pytest.raises(ValueError, match="steps must name some of"):
        check.step_seconds(420, ["grid", "nonsense"])
    with pytest.raises(ValueError, match="step must be one of"):
        check.run_step("nonsense", Path("."), 1.0)


@pytest.mark.slow
def test_the_noise_and_train_steps_run_their_studies_commands(tmp_path, capsys):
    """The two steps a separate shell script used to run, as steps of the check: dry, the noise step measures one
    tiny emulated problem into noise_cuda.csv and the train step only reports the tokens file."""
    assert check.run_step("noise", tmp_path, 60.0, dry_run=True) == 0
    noise = pd.read_csv(tmp_path / "noise_cuda.csv")
    assert file_kind(tmp_path / "noise_cuda.csv") == "noise" and set(noise["family"]) == {"random"}
    assert check.run_step("train", tmp_path, 60.0, dry_run=True) == 0
    assert "dry run: planned only" in capsys.readouterr().out


def test_a_step_skips_work_its_deadline_cannot_hold(tmp_path):
    lines: list[str] = []
    counts = check.run_grid_step(tmp_path, check.Deadline.after(0.0), echo=lines.append)
    assert counts["groups_run"] == 0 and counts["groups_skipped"] > 0
    committed = RESULTS_DIR / "cuda.csv"  # the step starts from it; with no time left it adds nothing
    assert (tmp_path / "cuda.csv").read_bytes() == committed.read_bytes()
    assert any(line.startswith("  skipped ") for line in lines)


def test_the_cuda_grid_puts_what_only_a_gpu_shows_first():
    configs = get_grid("cuda").configs
    first = configs[0]
    assert (first.device, first.seed, first.shape) == ("cuda", 0, CUDA_FAMILY_SHAPE)
    devices = [c.device for c in configs]
    last_seed0 = max(i for i, c in enumerate(configs) if c.seed == 0)
    assert all(c.seed > 0 for c in configs[last_seed0 + 1:])  # extra seeds come last
    assert devices.index("cuda-tf32") > max(i for i, c in enumerate(configs) if c.shape in CUDA_HEADLINE_SHAPES
                                            and c.device == "cuda")
    headline = [c for c in configs if c.shape in CUDA_HEADLINE_SHAPES]
    assert {c.shape for c in headline} == set(CUDA_HEADLINE_SHAPES) and {c.dtype for c in headline} == {"bfloat16"}
    assert {c.family for c in configs if c.shape == CUDA_FAMILY_SHAPE} == set(FAMILIES_IN_GRIDS)


def test_dry_run_configs_are_tiny_emulated_lce_runs():
    small = check.dry_run_configs(get_grid("cuda").configs)
    assert small and {c.device for c in small} == {"cuda-emulated"} and {c.op for c in small} == {"lce"}
    assert all(c.N * c.C <= 2**17 and c.seed == 0 for c in small)


def test_tf32_device_sets_and_restores_the_matmul_precision():
    before = torch.get_float32_matmul_precision()
    with float32_matmul_precision("high"):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    assert tensor_device("cuda-tf32") == "cuda" and tensor_device("cuda-emulated") == "cpu"
    with pytest.raises(ValueError, match="device must be one of"):
        tensor_device("tpu")
    assert reference_block_elements(torch.device("cpu")) == REFERENCE_BLOCK_ELEMENTS


class _Pip:
    """Stands in for ``pip download``: writes a wheel for the packages it has, fails for the others."""

    def __init__(self, has: set[str], size: int = 10) -> None:
        self.has, self.size, self.commands = has, size, []

    def __call__(self, command):
        self.commands.append(command)
        name, _, version = command[-1].partition("==")
        folder = Path(command[command.index("--dest") + 1])
        if name not in self.has:
            return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for " + name)
        (folder / f"{name.replace('-', '_')}-{version or '1.0'}-py3-none-any.whl").write_bytes(b"x" * self.size)
        return subprocess.CompletedProcess(command, 0, "Saved", "")


def test_gpu_wheels_downloads_without_dependencies_for_python_3_12(tmp_path):
    pip = _Pip({"liger-kernel", "cut-cross-entropy", "transformers"})
    lines = wheels.download_wheels(tmp_path, runner=pip)
    assert all({"--no-deps", "--only-binary=:all:"} <= set(c) and c[c.index("--python-version") + 1] == "3.12"
               for c in pip.commands)
    assert [c[-1] for c in pip.commands] == ["liger-kernel", "cut-cross-entropy", "transformers==5.23.0"]
    assert lines[0].startswith("liger-kernel: liger_kernel-1.0") and "limit 60 MiB" in lines[-1]
    assert all(wheels.wheel_status(tmp_path).values())


def test_gpu_wheels_names_a_package_without_a_wheel_and_a_folder_too_heavy(tmp_path):
    with pytest.raises(RuntimeError, match="no wheel could be downloaded for cut-cross-entropy"):
        wheels.download_wheels(tmp_path / "a", runner=_Pip({"liger-kernel", "transformers"}))
    with pytest.raises(RuntimeError, match="at or above the 0 MiB limit"):
        wheels.download_wheels(tmp_path / "b", runner=_Pip({"liger-kernel", "cut-cross-entropy", "transformers"}),
                               limit_bytes=15)


def test_wheels_are_unpacked_without_pip(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    with zipfile.ZipFile(folder / "liger_kernel-9.9-py3-none-any.whl", "w") as archive:
        archive.writestr("liger_kernel/__init__.py", "")
    lines = wheels.unpack_wheels(folder, tmp_path / "site")
    if not any(line.startswith("liger-kernel: importable already") for line in lines):
        assert (tmp_path / "site" / "liger_kernel" / "__init__.py").exists()
        assert "liger-kernel: unpacked liger_kernel-9.9-py3-none-any.whl" in lines
    assert any(line.startswith("cut-cross-entropy: no wheel") for line in lines)


def test_a_pinned_package_is_unpacked_over_another_release_the_machine_has(tmp_path, monkeypatch):
    """The GPU image has transformers 5.17: the pinned wheel is unpacked (and goes first on the steps' path); at the
    pinned release it is left alone."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    pinned = wheels.pinned_version("transformers")
    with zipfile.ZipFile(folder / f"transformers-{pinned}-py3-none-any.whl", "w") as archive:
        archive.writestr("transformers/__init__.py", "")
    machine = {"transformers": "5.17.0"}
    monkeypatch.setattr(wheels, "installed_version", lambda package: machine.get(package.name))
    lines = wheels.unpack_wheels(folder, tmp_path / "site")
    assert f"transformers: unpacked transformers-{pinned}-py3-none-any.whl over the machine's 5.17.0" in lines
    assert (tmp_path / "site" / "transformers" / "__init__.py").exists()
    machine["transformers"] = pinned
    assert f"transformers: importable already ({pinned})" in wheels.unpack_wheels(folder, tmp_path / "again")
    with pytest.raises(ValueError, match="constraints.txt pins no version of nonsense"):
        wheels.pinned_version("nonsense")


def _sweep_rows(device: str, floors: float, policy: str = "balanced", rows_per_chunk: int = 16,
                chunking: str = "auto") -> list[dict]:
    rows = []
    for seed in (0, 1):
        rows.append(dict(op="lce", dtype="bfloat16", N=2048, D=128, C=16384, policy=policy, chunking=chunking,
                         acc_dtype="float32", bias=True, family="calibrated", seed=seed, device=device, status="ok",
                         resolved_policy=policy, resolved_acc_dtype="float32", chunk_size=rows_per_chunk,
                         grad_input_fro_in_floors=floors, grad_weight_fro_in_floors=2 * floors,
                         device_name="NVIDIA H200" if device == "cuda" else "CPU"))
    return rows


def test_emulated_and_real_runs_pair_on_the_same_computation():
    table = pd.DataFrame(_sweep_rows("cuda-emulated", 1.0) + _sweep_rows("cuda", 1.5) + _sweep_rows("cuda-tf32", 9.0)
                         + _sweep_rows("cuda", 3.0, policy="compact")  # no emulated twin: left out
                         # the same call, but "auto" resolved to other chunks when it was emulated: left out
                         + _sweep_rows("cuda-emulated", 1.0, chunking="aspect_ratio", rows_per_chunk=2048)
                         + _sweep_rows("cuda", 4.0, chunking="aspect_ratio", rows_per_chunk=16))
    pairs = nb04_pareto.emulated_vs_real(table)
    assert len(pairs) == 2 and set(pairs["resolved_policy"]) == {"balanced"}
    assert pairs["grad_weight_ratio"].tolist() == [1.5, 1.5] and pairs["grad_input_real"].tolist() == [1.5, 1.5]
    figure = nb04_pareto.plot_emulated_vs_real(table)
    assert figure.stem == "cuda_emulated_vs_real" and "2 lce configurations" in figure.caption
    assert "NVIDIA H200" in figure.caption and "median 1.50" in figure.caption


def test_no_gpu_rows_draw_nothing():
    assert nb04_pareto.plot_emulated_vs_real(pd.DataFrame(_sweep_rows("cuda-emulated", 1.0))) is None
    assert nb04_pareto.draw_gpu_figures(pd.DataFrame()) == []


def test_cuda_verdicts_use_the_gpus_runs_where_there_are_any():
    emulated_only = pd.DataFrame(_sweep_rows("cuda-emulated", 1.0))
    both = pd.DataFrame(_sweep_rows("cuda-emulated", 1.0) + _sweep_rows("cuda", 1.5))
    assert _devices_for("cuda", emulated_only, "bfloat16") == ("cuda-emulated",)
    assert _devices_for("cuda", both, "bfloat16") == ("cuda",)
    assert _devices_for("cuda", both, "float16") == ("cuda-emulated",)
    assert _devices_for("cpu", both, "bfloat16") == ("cpu",)


def test_the_bench_times_lces_default_and_low_memory_options_beside_the_peers_at_three_heads():
    """Issue 44's bench: at each head lce's default options, its low-memory option (one chunk of rows, blocks of
    classes, fp32 sums: no (C, D) accumulator), the unfused op, Liger, Cut Cross-Entropy (without a bias only: it
    takes none) and the compiled unfused op last."""
    assert [str(shape) for shape in check.BENCH_SHAPES] == ["8192x2304x256000", "16384x4096x128256",
                                                             "8192x4096x128256"]
    for shape in check.BENCH_SHAPES:
        low = check.low_memory_spec(shape)
        assert low.chunking == f"rows:{shape.N}" and low.classes  # one chunk of rows, blocks of classes
        plan = meta_plan(low, shape, "bfloat16", "cuda")
        assert plan.num_chunks == 1 and plan.weight_grad_sum_dtype == torch.bfloat16  # no (C, D) accumulator
        assert max(predict_errors(plan).values()) <= 1.25  # the accurate default's limit
        specs = [str(spec) for spec in check.bench_specs(shape)]
        assert specs[0] == "lce[auto,auto,acc=default]" and specs[1] == str(low) and specs[-1] == "compiled"
        assert "cce" in specs and "cce" not in [str(spec) for spec in check.bench_specs(shape, bias=True)]


def test_the_grid_step_resumes_from_the_committed_grid_and_never_over_a_calls_own_rows(tmp_path):
    """A new call starts from the committed cuda.csv (only the missing problems run); an --out that already has
    rows keeps them; without committed rows there is nothing to copy."""
    committed, out = tmp_path / "committed", tmp_path / "out"
    committed.mkdir(), out.mkdir()
    assert check.resume_from_committed(out, "cuda", committed) == [] and not (out / "cuda.csv").exists()
    (committed / "cuda.csv").write_text("key,status\na,ok\nb,error\n", encoding="utf-8")
    lines = check.resume_from_committed(out, "cuda", committed)
    assert len(lines) == 1 and "(2 rows)" in lines[0]
    assert (out / "cuda.csv").read_text(encoding="utf-8") == (committed / "cuda.csv").read_text(encoding="utf-8")
    (out / "cuda.csv").write_text("key,status\nc,ok\n", encoding="utf-8")
    assert check.resume_from_committed(out, "cuda", committed) == []
    assert (out / "cuda.csv").read_text(encoding="utf-8") == "key,status\nc,ok\n"



def test_a_failed_smoke_step_stops_the_check_before_anything_is_measured(tmp_path, monkeypatch):
    """A kernel that does not compile on the GPU (the smoke step's exit 1) ends the call: the bench would otherwise
    time the PyTorch ops' fallback beside the peers as lce's."""
    ran = []

    def fake_run(command, timeout, log, env):
        step = command[command.index("--step") + 1]
        ran.append(step)
        return (1 if step == "smoke" else 0), 0.1

    monkeypatch.setattr(check, "_run_logged", fake_run)
    results = check.run_check(tmp_path, budget_s=60, dry_run=True, wheels=tmp_path / "no-wheels")
    assert ran == ["smoke"] and results == {"smoke": (1, 0.1)}
    assert "the smoke step failed" in (tmp_path / check.LOG_NAME).read_text()


def test_the_tests_step_keeps_what_pytest_printed_when_it_is_cut_short():
    """The tests step streams pytest's lines into the log as they come: a run killed at its limit keeps them
    (the H200's tests step once lost its whole output at the limit)."""
    lines = []
    code = check._streamed([sys.executable, "-c", "import time; print('first', flush=True); time.sleep(30)"], 3.0,
                           lines.append)
    assert code is None and lines == ["first"]
    assert check._streamed([sys.executable, "-c", "print('done')"], 30.0, lines.append) == 0 and lines[-1] == "done"
