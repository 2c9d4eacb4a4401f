"""Head dumps on disk: the ``(x, W, y)`` a trained model's head sees on held-out text, saved and loaded.

A dump holds, for one checkpoint of the model,

* ``x``: ``(rows, d_model)`` fp32, the final-normed hidden states the head reads;
* ``weight``: ``(vocab_size, d_model)`` fp32, the head weight ``W`` (no bias);
* ``target``: ``(rows,)`` int64, the next token after each position,

so ``cross_entropy(x @ weight.T, target)`` is the model's own loss on those positions. Each dump is a
``head-<checkpoint>.npz`` with a ``head-<checkpoint>.json`` beside it (provenance, step, losses). The
``trained`` input family (:mod:`analysis.core.families`) reads them; :mod:`analysis.lm` computes and writes
them.

The ``.npz`` is compressed (``np.savez_compressed``) and holds each array as its *byte planes*: a ``uint8``
array ``(itemsize, *shape)`` whose plane ``k`` is byte ``k`` (little-endian) of every element. Deflate finds
little to share among fp32 values whose bytes alternate sign-and-exponent with noisy mantissa; regrouped, the
exponent bytes of a trained head (a few distinct values) compress fourfold, and the dumps shrink from
9.5 MB to 7.7 MB each, losslessly: :func:`load_head_dump` returns the very bits :func:`save_head_dump` got.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from analysis.paths import LM_DATA_DIR, display_path

__all__ = ["HeadDump", "MAKE_COMMAND", "ARRAY_DTYPES", "save_head_dump", "load_head_dump", "available_checkpoints",
           "to_byte_planes", "from_byte_planes"]

MAKE_COMMAND = "python -m analysis lm"
"""The command that writes the committed dumps."""
ARRAY_DTYPES: dict[str, np.dtype] = {"x": np.dtype(np.float32), "weight": np.dtype(np.float32),
                                     "target": np.dtype(np.int64)}
"""Each array of a dump and its dtype, which the file leaves out (it stores bytes)."""


@dataclass(frozen=True)
class HeadDump:
    """One checkpoint's head inputs: ``x`` (N, D) fp32, ``weight`` (C, D) fp32, ``target`` (N,) int64,
    all CPU tensors, and ``meta`` (the JSON metadata: provenance, step, losses)."""

    x: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    meta: dict


def _paths(folder: Path, checkpoint: str) -> tuple[Path, Path]:
    return folder / f"head-{checkpoint}.npz", folder / f"head-{checkpoint}.json"


def to_byte_planes(array: np.ndarray) -> np.ndarray:
    """``array``'s bytes regrouped by significance: ``(itemsize, *shape)`` uint8, plane ``k`` holding byte ``k``
    (little-endian) of every element; :func:`from_byte_planes` undoes it."""
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return np.moveaxis(little.view(np.uint8).reshape(*array.shape, array.itemsize), -1, 0).copy()


def from_byte_planes(planes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The array of ``dtype`` whose byte planes (:func:`to_byte_planes`) are ``planes``, in native byte order.

    ``ValueError`` naming the shape and dtype when ``planes`` is not ``uint8`` with one plane per byte of ``dtype``.
    """
    dtype = np.dtype(dtype)
    if planes.dtype != np.uint8 or planes.ndim < 1 or planes.shape[0] != dtype.itemsize:
        raise ValueError(f"planes must be uint8 of shape ({dtype.itemsize}, ...) for {dtype}, got {planes.dtype} "
                         f"{planes.shape}")
    joined = np.ascontiguousarray(np.moveaxis(planes, 0, -1))
    return joined.view(dtype.newbyteorder("<")).reshape(planes.shape[1:]).astype(dtype)


def save_head_dump(dump: HeadDump, checkpoint: str, folder: Path | str = LM_DATA_DIR) -> tuple[Path, Path]:
    """Write ``head-<checkpoint>.npz`` (compressed byte planes) and ``head-<checkpoint>.json`` into ``folder``;
    returns both paths. ``ValueError`` naming the array whose dtype is not :data:`ARRAY_DTYPES`'."""
    if not checkpoint or not checkpoint.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"checkpoint name must be letters, digits, '-' or '_', got {checkpoint!r}")
    values = {"x": dump.x.numpy(), "weight": dump.weight.numpy(), "target": dump.target.numpy()}
    for name, value in values.items():
        if value.dtype != ARRAY_DTYPES[name]:
            raise ValueError(f"dump.{name} must be {ARRAY_DTYPES[name]}, got {value.dtype}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays, meta = _paths(folder, checkpoint)
    with open(arrays.with_name(arrays.name + ".tmp"), "wb") as file:
        np.savez_compressed(file, **{name: to_byte_planes(value) for name, value in values.items()})
    os.replace(arrays.with_name(arrays.name + ".tmp"), arrays)
    meta.with_name(meta.name + ".tmp").write_text(json.dumps(dump.meta, indent=2, sort_keys=True) + "\n",
                                                  encoding="utf-8")
    os.replace(meta.with_name(meta.name + ".tmp"), meta)
    return arrays, meta


def available_checkpoints(folder: Path | str = LM_DATA_DIR) -> list[str]:
    """The checkpoint names with both files in ``folder``, ordered by training step."""
    folder = Path(folder)
    names = [path.name[len("head-"):-len(".npz")] for path in folder.glob("head-*.npz")
             if _paths(folder, path.name[len("head-"):-len(".npz")])[1].exists()]
    steps = {name: json.loads(_paths(folder, name)[1].read_text(encoding="utf-8")).get("step", 0) for name in names}
    return sorted(names, key=lambda name: (steps[name], name))


def load_head_dump(checkpoint: str = "final", folder: Path | str = LM_DATA_DIR) -> HeadDump:
    """The dump of ``checkpoint`` (``"early"``, ``"final"``, ...) from ``folder``.

    Raises ``FileNotFoundError`` naming the available checkpoints and the command that writes them
    when the dump is missing.
    """
    folder = Path(folder)
    arrays, meta = _paths(folder, checkpoint)
    if not (arrays.exists() and meta.exists()):
        have = available_checkpoints(folder) if folder.is_dir() else []
        raise FileNotFoundError(
            f"no head dump {checkpoint!r} in {display_path(folder)} (available: {', '.join(have) or 'none'}); "
            f"`{MAKE_COMMAND}` trains the model and writes the dumps (about 15 minutes on 2 cores)")
    with np.load(arrays) as data:
        try:
            x, weight, target = (torch.from_numpy(from_byte_planes(data[name], dtype))
                                 for name, dtype in ARRAY_DTYPES.items())
        except ValueError as error:
            raise ValueError(f"{display_path(arrays)} does not hold a head dump's byte planes ({error}); "
                             f"`{MAKE_COMMAND}` writes one") from error
    return HeadDump(x, weight, target, json.loads(meta.read_text(encoding="utf-8")))
