"""python -m analysis: every subcommand dispatches to its handler and answers --help; usage errors say why."""

from __future__ import annotations

import pytest

from analysis.cli import build_parser, main
from analysis.core.results_io import file_kind, read_table

SUBCOMMANDS = ("sweep", "figures", "reproduce", "bench", "demo", "memory-study", "notebooks", "grids", "verdicts",
               "lm", "family-stats", "margins", "rare-rows", "noise", "train", "hf-step")


def test_every_subcommand_is_registered_with_a_handler():
    parser = build_parser()
    choices = next(action.choices for action in parser._actions if action.dest == "command")
    assert set(SUBCOMMANDS) <= set(choices)
    for name, subparser in choices.items():
        assert callable(subparser.get_default("handler")), name


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert f"python -m analysis {name}" in text and len(text.split()) > 15


def test_usage_errors_name_the_problem(capsys):
    for argv, expected in ((["sweep", "--shard", "5/4"], "shard must be K/N"),
                           (["bench", "--shape", "64x8"], "NxDxC"),
                           (["bench", "--chunk-sweep", "--scaling"], "not allowed with"),
                           (["sweep", "--grid", "nope"], "invalid choice"),
                           (["rare-rows", "--policies", "auto,nope"], "expected names from"),
                           (["margins", "--margins", "0,-5"], "non-negative"),
                           (["train", "--arms", "fp32,fp8 compact"], "expected names from"),
                           (["train", "--seed-list", "0,-1"], "non-negative seeds"),
                           (["noise", "--families", "nope"], "family")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert expected in capsys.readouterr().err


def test_grids_and_demo_run(capsys):
    assert main(["grids"]) == 0
    assert "quick" in capsys.readouterr().out
    assert main(["demo", "--rows", "32", "--features", "8", "--classes", "64", "--dtypes", "bfloat16"]) == 0
    text = capsys.readouterr().out
    assert "lce plan on cpu" in text and "(floor)" in text
    assert sum(line.startswith(("lce   ", "torch   ")) for line in text.splitlines()) == 8  # 4 settings x 2 ops


@pytest.mark.slow
def test_memory_study_writes_its_results_files(tmp_path, capsys):
    assert main(["memory-study", "--shape", "64x16x512", "--results", str(tmp_path)]) == 0
    breakdown, trace = tmp_path / "memory_breakdown.csv", tmp_path / "memory_trace.csv.gz"
    assert file_kind(breakdown) == "memory_breakdown" and file_kind(trace) == "memory_trace"
    table = read_table(trace)
    assert set(table["config"]) == {"lce auto", "lce balanced acc=fp32", "lce compact acc=bf16", "torch auto",
                                    "reference"}
    assert (table[["N", "D", "C"]].drop_duplicates().values.tolist() == [[64, 16, 512]]
            and table["git_revision"].notna().all())
    assert (read_table(breakdown)["predicted_peak_bytes"] > 0).all()
    main(["memory-study", "--shape", "64x16x512", "--results", str(tmp_path)])  # a rerun replaces, never appends
    assert len(read_table(trace)) == len(table) and (tmp_path / "memory_trace.csv.gz.previous").exists()
    assert "memory_trace.csv.gz" in capsys.readouterr().out


@pytest.mark.slow
def test_margins_writes_its_results_file(tmp_path, capsys):
    assert main(["margins", "--shape", "8x16x128", "--seeds", "1", "--margins", "0,40", "--dtypes", "bfloat16",
                 "--results", str(tmp_path)]) == 0
    path = tmp_path / "margins.csv.gz"
    assert file_kind(path) == "margins" and "margins.csv.gz" in capsys.readouterr().out
    table = read_table(path)
    assert len(table) == 17 * 2 and table["git_revision"].notna().all() and (table["cpu_s"] > 0).all()
