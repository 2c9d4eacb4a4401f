"""The training text of the ``trained`` input family: Python's own standard library source.

Every CPython installation ships its standard library as ``.py`` files, so the corpus needs no
download and is the same wherever the same Python version runs. Third-party packages installed
beside it (``site-packages``, ``dist-packages``) are left out, as is any file whose real path lies
outside the root folder (a symlink out of it). Files are taken in sorted relative-path order and
split into train and held-out sets *by file*, from a hash of each relative path, so a file's side
never depends on which other files exist or the order they were found in.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CorpusFile", "Corpus", "stdlib_root", "load_corpus", "is_heldout", "HELDOUT_FRACTION"]

HELDOUT_FRACTION: float = 0.05
"""The share of files (by path hash, so only about this share) kept out of training."""

_EXCLUDED_FOLDERS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class CorpusFile:
    """One source file: its path relative to the corpus root (``/``-separated) and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The decoded files of one root folder, in sorted path order, and what was left out.

    ``sha256`` identifies the corpus: it covers every kept file's relative path and bytes in order
    (each length-prefixed, so no two different corpora hash alike by shifting a boundary).
    """

    root: Path
    files: tuple[CorpusFile, ...]
    undecodable: tuple[str, ...]
    heldout_fraction: float
    sha256: str
    num_bytes: int

    @property
    def train_files(self) -> tuple[CorpusFile, ...]:
        return tuple(f for f in self.files if not is_heldout(f.path, self.heldout_fraction))

    @property
    def heldout_files(self) -> tuple[CorpusFile, ...]:
        return tuple(f for f in self.files if is_heldout(f.path, self.heldout_fraction))

    def provenance(self) -> dict[str, object]:
        """What a reader needs to know which text a model was trained on."""
        return {"corpus_root": str(self.root), "python_version": platform.python_version(),
                "corpus_files": len(self.files), "corpus_bytes": self.num_bytes,
                "corpus_undecodable_files": len(self.undecodable), "corpus_sha256": self.sha256,
                "heldout_fraction": self.heldout_fraction, "heldout_files": len(self.heldout_files)}


def stdlib_root() -> Path:
    """The running interpreter's standard library folder (``sysconfig``'s ``stdlib`` path)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Whether the file at ``relative_path`` belongs to the held-out set.

    The first 8 bytes of the path's sha256, read as a number in [0, 1), fall below ``fraction``:
    a property of the path alone.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"heldout fraction must lie in [0, 1), got {fraction!r}")
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


def _source_paths(root: Path) -> list[tuple[str, Path]]:
    real_root = root.resolve()
    found = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if _EXCLUDED_FOLDERS.intersection(relative.parts[:-1]) or not path.is_file():
            continue
        if not path.resolve().is_relative_to(real_root):
            continue
        found.append((relative.as_posix(), path))
    return sorted(found)


def load_corpus(root: Path | str | None = None, heldout_fraction: float = HELDOUT_FRACTION) -> Corpus:
    """Read every ``.py`` file under ``root`` (default: :func:`stdlib_root`) as UTF-8.

    Files that are not valid UTF-8 (the standard library's tests hold a few on purpose) are
    skipped and listed in ``Corpus.undecodable``. Raises ``FileNotFoundError`` if ``root`` is not
    a folder and ``ValueError`` if it holds no readable ``.py`` file.
    """
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {str(root)!r} is not a folder")
    is_heldout("", heldout_fraction)  # validates the fraction before reading anything
    digest = hashlib.sha256()
    files, undecodable, num_bytes = [], [], 0
    for relative, path in _source_paths(root):
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            undecodable.append(relative)
            continue
        name = relative.encode("utf-8")
        for part in (name, data):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        files.append(CorpusFile(relative, text))
        num_bytes += len(data)
    if not files:
        raise ValueError(f"corpus root {str(root)!r} holds no UTF-8 .py file")
    return Corpus(root, tuple(files), tuple(undecodable), heldout_fraction, digest.hexdigest(), num_bytes)
