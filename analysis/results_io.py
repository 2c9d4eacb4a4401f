"""The results CSV: column order, atomic row appends, reading and merging.

Every append rewrites the file to a temporary sibling, flushes it to disk and
renames it over the original (``os.replace`` is atomic on POSIX), so a crash at
any moment leaves either the old file or the new one, never half a row.
Rewriting is O(rows) per append; a grid has at most a few thousand rows.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from .grids import RunConfig
from .inputs import OUTPUT_NAMES

__all__ = ["COLUMNS", "append_row", "read_rows", "done_keys", "load_results"]

_CONFIG_COLUMNS = ["key", "grid"] + [f for f in RunConfig.__dataclass_fields__]
_RESOLVED_COLUMNS = ["resolved_policy", "resolved_acc_dtype", "chunk_size", "num_chunks"]
_ERROR_SUFFIXES = ["rel_fro", "max_rel", "floor_fro", "floor_max", "fro_in_floors", "max_in_floors"]
_ERROR_COLUMNS = [f"{name}_{suffix}" for name in OUTPUT_NAMES for suffix in _ERROR_SUFFIXES]
_COST_COLUMNS = ["peak_bytes_measured", "peak_bytes_modeled", "memory_method", "time_median_s", "time_spread_s",
                 "time_repeats"]
_PROVENANCE_COLUMNS = ["lce_version", "torch_version", "device_name", "cpu_model", "num_threads", "git_revision",
                       "date"]
_STATUS_COLUMNS = ["status", "note"]

COLUMNS: tuple[str, ...] = tuple(_CONFIG_COLUMNS + _RESOLVED_COLUMNS + _ERROR_COLUMNS + _COST_COLUMNS
                                 + _STATUS_COLUMNS + _PROVENANCE_COLUMNS)
"""Every CSV column, in file order: config, resolved plan, errors, costs, status, provenance."""


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def read_rows(path: Path) -> list[dict[str, str]]:
    """Every row of ``path`` as strings (``[]`` if it does not exist)."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def done_keys(path: Path) -> set[str]:
    """Keys of the runs ``path`` already holds."""
    return {row["key"] for row in read_rows(path)}


def append_row(path: Path, row: Mapping[str, object]) -> None:
    """Append ``row`` (columns: :data:`COLUMNS`) to ``path`` atomically.

    ``ValueError`` naming the columns if ``row`` has any not in :data:`COLUMNS`.
    """
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns not in COLUMNS: {sorted(unknown)}")
    rows = read_rows(path)
    rows.append({column: _format(row.get(column)) for column in COLUMNS})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8", newline="") as handle:
        handle.write(buffer.getvalue())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def load_results(paths: Iterable[Path]) -> pd.DataFrame:
    """Concatenate result CSVs (e.g. the shards of one grid), one row per key (the newest wins)."""
    frames = [pd.read_csv(path) for path in paths if Path(path).exists()]
    frames = [frame for frame in frames if len(frame)]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.concat(frames, ignore_index=True)
    table = table.sort_values("date", kind="stable").drop_duplicates("key", keep="last")
    return table.reset_index(drop=True)
