"""python -m analysis: every subcommand dispatches to its handler and answers --help; usage errors say why."""

from __future__ import annotations

import pytest

from analysis.cli import build_parser, main

SUBCOMMANDS = ("sweep", "figures", "reproduce", "bench", "demo", "notebooks", "grids", "verdicts")


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
                           (["sweep", "--grid", "nope"], "invalid choice")):
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
