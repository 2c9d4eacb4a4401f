"""analysis.core.results_io: one append-only writer for every results file, and files told apart by kind."""

from __future__ import annotations

import builtins
import gzip

import pandas as pd
import pytest

from analysis.core import results_io
from analysis.core.results_io import (
    BENCH,
    CHUNK_SWEEP,
    KINDS,
    SWEEP,
    append_row,
    append_rows,
    done_keys,
    file_kind,
    is_compressed,
    load_kind,
    paths_of_kind,
    read_rows,
    read_table,
    replace_rows,
    results_stem,
    write_csv_atomically,
)
from analysis.paths import RESULTS_DIR


def _bench_row(value: float, **extra) -> dict[str, object]:
    return BENCH.row(impl="lce", dtype="float32", N=64, D=8, C=256, metric="time_s", value=value, **extra)


def test_rows_are_appended_and_read_back(tmp_path):
    path = tmp_path / "bench.csv"
    append_row(path, _bench_row(1.5))
    append_rows(path, [_bench_row(2.5, spread_s=0.25), _bench_row(0.1 + 0.2)])
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(BENCH.columns) and len(lines) == 4  # one header, one line per row
    table = read_table(path)
    assert table["value"].tolist() == [1.5, 2.5, 0.1 + 0.2]  # floats round-trip exactly
    assert table["kind"].unique().tolist() == ["bench"] and table["spread_s"].isna().tolist() == [True, False, True]
    assert append_rows(path, []) == 0


def test_appending_reads_only_the_head_and_tail_of_the_file(tmp_path, monkeypatch):
    """O(1) per row: appending to a long file reads its header, first row and last line, nothing else."""
    path = tmp_path / "long.csv"
    append_rows(path, [_bench_row(float(i)) for i in range(5000)])
    size = path.stat().st_size
    read = {"bytes": 0}
    real_open = builtins.open

    class Counting:
        def __init__(self, handle):
            self._handle = handle

        def read(self, *args):
            data = self._handle.read(*args)
            read["bytes"] += len(data)
            return data

        def readline(self, *args):
            data = self._handle.readline(*args)
            read["bytes"] += len(data)
            return data

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._handle.__exit__(*exc)

    monkeypatch.setattr(results_io, "open", lambda *a, **k: Counting(real_open(*a, **k)), raising=False)
    append_row(path, _bench_row(-1.0))
    assert 0 < read["bytes"] <= 4096 + 2 * len(path.read_text().splitlines()[0]) < size / 50
    monkeypatch.undo()
    assert len(read_rows(path)) == 5001 and read_rows(path)[-1]["value"] == "-1.0"


def test_a_row_with_other_columns_is_refused(tmp_path):
    path = tmp_path / "bench.csv"
    append_row(path, _bench_row(1.0))
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"header of bench.csv: missing \['date'\], extra \['when'\]"):
        append_row(path, {**{c: v for c, v in _bench_row(2.0).items() if c != "date"}, "when": "now"})
    with pytest.raises(ValueError, match="another order"):
        append_row(path, dict(reversed(list(_bench_row(2.0).items()))))
    with pytest.raises(ValueError, match="holds 'bench' rows"):
        append_row(path, CHUNK_SWEEP.row(impl="lce", value=1.0))  # same columns, other kind
    with pytest.raises(ValueError, match="differ from the first row's"):
        append_rows(tmp_path / "new.csv", [_bench_row(1.0), SWEEP.row(key="k")])
    assert path.read_bytes() == before and not (tmp_path / "new.csv").exists()
    with pytest.raises(ValueError, match="has no columns \\['bogus'\\]"):
        BENCH.row(bogus=1)


def test_an_unfinished_last_line_is_ignored_then_cut_off(tmp_path):
    """What a crash in the middle of a write leaves: readers skip it, the next append removes it."""
    path = tmp_path / "sweep.csv"
    append_rows(path, [SWEEP.row(key="a", status="ok"), SWEEP.row(key="b", status="ok")])
    complete = path.read_bytes()
    path.write_bytes(complete + b"sweep,c,tin")
    assert done_keys(path) == {"a", "b"} and len(read_table(path)) == 2
    append_row(path, SWEEP.row(key="d", status="ok"))
    assert path.read_bytes().startswith(complete) and done_keys(path) == {"a", "b", "d"}
    assert path.read_text().count("\n") == 4
    header_only = tmp_path / "header.csv"
    header_only.write_text("kind,ke")  # crashed while writing the header
    append_row(header_only, SWEEP.row(key="x"))
    assert read_rows(header_only)[0]["key"] == "x"


def test_line_breaks_inside_a_value_stay_on_one_line(tmp_path):
    path = tmp_path / "sweep.csv"
    append_row(path, SWEEP.row(key="a", status="error", note="RuntimeError: first\nsecond, third"))
    assert path.read_text().count("\n") == 2
    assert read_rows(path)[0]["note"] == "RuntimeError: first second, third"


def test_readers_choose_files_by_kind_not_by_name(tmp_path):
    append_row(tmp_path / "bench_is_a_sweep.csv", SWEEP.row(key="a", date="2026-01-01", status="ok"))
    append_row(tmp_path / "x.csv", _bench_row(1.0))
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")  # no kind column: not a results file
    (tmp_path / "empty.csv").write_text(",".join(BENCH.columns) + "\n")
    assert [p.name for p in paths_of_kind(tmp_path, "sweep")] == ["bench_is_a_sweep.csv"]
    paths, table = load_kind(tmp_path, "bench")
    assert [p.name for p in paths] == ["x.csv"] and table["value"].tolist() == [1.0]
    _, none = load_kind(tmp_path, "memory_trace")
    assert none.empty and list(none.columns) == list(KINDS["memory_trace"].columns)
    with pytest.raises(ValueError, match="kind must be one of"):
        paths_of_kind(tmp_path, "nope")


def test_every_committed_results_file_has_a_kind():
    for path in sorted(RESULTS_DIR.glob("*.csv")):
        kind = file_kind(path)
        assert kind in KINDS, path.name
        assert list(pd.read_csv(path, nrows=0).columns) == list(KINDS[kind].columns), path.name
    for path in sorted(RESULTS_DIR.glob("*.csv.gz")):
        kind = file_kind(path)
        assert kind in KINDS, path.name
        assert list(pd.read_csv(path, nrows=0).columns) == list(KINDS[kind].columns), path.name


def test_a_compressed_file_holds_what_a_plain_one_holds(tmp_path):
    """``<name>.csv.gz``: the same rows, one gzip member per append, read back as the plain file's."""
    rows = [[_bench_row(1.5)], [_bench_row(2.5, spread_s=0.25), _bench_row(0.1 + 0.2)]]
    plain, packed = tmp_path / "bench.csv", tmp_path / "bench.csv.gz"
    for block in rows:
        append_rows(plain, block)
        append_rows(packed, block)
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()  # concatenated members, one text
    pd.testing.assert_frame_equal(read_table(packed), read_table(plain))
    pd.testing.assert_frame_equal(pd.read_csv(packed), read_table(plain))  # pandas reads every member too
    assert read_rows(packed) == read_rows(plain) and file_kind(packed) == "bench"
    before = packed.read_bytes()
    with pytest.raises(ValueError, match="holds 'bench' rows"):
        append_row(packed, CHUNK_SWEEP.row(impl="lce", value=1.0))
    with pytest.raises(ValueError, match="another order"):
        append_row(packed, dict(reversed(list(_bench_row(2.0).items()))))
    assert packed.read_bytes() == before


def test_an_unfinished_last_member_is_ignored_then_cut_off(tmp_path):
    """What a crash in the middle of an append to a ``.csv.gz`` leaves: readers skip it, the next append removes it."""
    path = tmp_path / "sweep.csv.gz"
    append_rows(path, [SWEEP.row(key="a", status="ok"), SWEEP.row(key="b", status="ok")])
    complete = path.read_bytes()
    cut_short = gzip.compress(b"sweep,c,tin", mtime=0)
    for tail in (cut_short[:-4], cut_short[:12], b"\x1f"):  # the trailer, the deflate stream, the header cut
        path.write_bytes(complete + tail)
        assert done_keys(path) == {"a", "b"} and len(read_table(path)) == 2 and file_kind(path) == "sweep"
    append_row(path, SWEEP.row(key="d", status="ok"))
    assert path.read_bytes().startswith(complete) and done_keys(path) == {"a", "b", "d"}
    assert gzip.decompress(path.read_bytes()).count(b"\n") == 4
    first_cut = tmp_path / "first.csv.gz"
    first_cut.write_bytes(cut_short[:-4])  # crashed while writing the first block: no row yet
    assert file_kind(first_cut) is None and read_rows(first_cut) == []
    append_row(first_cut, SWEEP.row(key="x"))
    assert read_rows(first_cut)[0]["key"] == "x" and len(read_rows(first_cut)) == 1


def test_readers_find_both_forms_and_refuse_one_file_in_both(tmp_path):
    append_row(tmp_path / "b.csv.gz", _bench_row(2.0))
    append_row(tmp_path / "a.csv", _bench_row(1.0))
    append_row(tmp_path / "c.csv", _bench_row(3.0))
    paths, table = load_kind(tmp_path, "bench")
    assert [p.name for p in paths] == ["a.csv", "b.csv.gz", "c.csv"] and table["value"].tolist() == [1.0, 2.0, 3.0]
    append_row(tmp_path / "c.csv.gz", _bench_row(3.0))
    with pytest.raises(ValueError, match=r"c.csv and c.csv.gz in .*: one results file in both forms"):
        paths_of_kind(tmp_path, "bench")


def test_whole_file_writers_keep_the_form_their_name_says(tmp_path):
    for name in ("bench.csv", "bench.csv.gz"):
        path = tmp_path / name
        assert replace_rows(path, [_bench_row(1.0)]) == 1 and replace_rows(path, [_bench_row(2.0)]) == 1
        assert replace_rows(path, []) == 0 and read_table(path)["value"].tolist() == [2.0]
        assert path.read_bytes().startswith(b"\x1f\x8b") == name.endswith(".gz")  # the gzip magic number
        write_csv_atomically(path, [_bench_row(3.0)], BENCH.columns)
        assert read_table(path)["value"].tolist() == [3.0] and file_kind(path) == "bench"
        raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
        assert b"\r" not in raw and raw.count(b"\n") == 2  # the line ends every appender writes
        assert path.read_bytes().startswith(b"\x1f\x8b") == name.endswith(".gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "bench.csv.gz"]  # no partial left behind


def test_the_stem_of_a_results_file_is_its_name_in_either_form():
    assert results_stem("training_long.csv") == results_stem(RESULTS_DIR / "training_long.csv.gz") == "training_long"
    assert is_compressed("x.csv.gz") and not is_compressed("x.csv")
    for bad in ("notes.txt", ".csv", "x.csv.gz.partial"):
        with pytest.raises(ValueError, match="path must name a results file"):
            results_stem(bad)
