"""Measured peak memory of one call: never the model, always an observation.

``measure_peak(fn)`` runs ``fn()`` once and returns its result with the peak of
bytes allocated *during* the call beyond what was allocated before it (inputs
and anything else alive already are excluded; gradients the call returns
are included, they are allocations the call made).

Methods, and why:

* ``"cuda"`` -- the CUDA caching allocator's own counters:
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus
  the bytes allocated at the start. Exact for tensor memory.
* ``"profiler"`` (CPU default) -- ``torch.profiler`` with
  ``profile_memory=True`` records one event per allocation and free made
  through c10's CPU allocator (every tensor), with its size and a timestamp.
  Summing the signed sizes in time order and taking the maximum gives the
  peak of live tensor bytes, exactly the quantity lce's memory model predicts
  (:attr:`lce.Plan.peak_extra_bytes`). It needs nothing beyond torch and runs
  in-process; it does not see memory a library mallocs behind the allocator's
  back (oneDNN/BLAS packing scratch, a few MiB at most).
* ``"memray"`` (cross-check) -- memray's in-process tracker hooks malloc,
  mmap and friends, so it sees *every* allocation, BLAS scratch included; its
  recorded peak is the high-water mark of bytes allocated during tracking.
  Slower, and it needs the ``memray`` package (Linux/macOS).

Rejected: the process's RSS high-water mark (``VmHWM`` after
``echo 5 > /proc/self/clear_refs``). RSS counts pages *touched*, not bytes
allocated (``torch.empty`` touches nothing), and glibc keeps freed blocks
mapped below its adaptive mmap threshold (up to 32 MiB), so RSS mixes the
allocator's history into the measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

__all__ = ["MemoryMeasurement", "measure_peak", "METHODS", "default_method", "allocation_trace"]

T = TypeVar("T")

METHODS: tuple[str, ...] = ("profiler", "memray", "cuda")
"""Every accepted ``method`` of :func:`measure_peak`."""


@dataclasses.dataclass(frozen=True)
class MemoryMeasurement:
    """Peak and net bytes allocated during one call, and how they were measured.

    ``peak_bytes`` is the high-water mark above the bytes live at the start;
    ``end_bytes`` what is still allocated when the call returns (its outputs).
    """

    peak_bytes: int
    end_bytes: int
    method: str
    live_at_peak: tuple[int, ...] = ()
    """Sizes in bytes of the allocations live at the peak, largest first ("profiler" only)."""


def default_method(device: torch.device | str) -> str:
    """``"cuda"`` for a CUDA device, else ``"profiler"``."""
    return "cuda" if torch.device(device).type == "cuda" else "profiler"


def measure_peak(fn: Callable[[], T], *, method: str = "profiler",
                 device: torch.device | str | None = None) -> tuple[T, MemoryMeasurement]:
    """Run ``fn()`` once; return its result and the peak extra bytes it allocated.

    ``method`` is one of :data:`METHODS` (see the module docstring); ``device``
    selects the CUDA device for ``"cuda"`` (default: the current one).
    """
    if method == "profiler":
        return _measure_with_profiler(fn)
    if method == "memray":
        return _measure_with_memray(fn)
    if method == "cuda":
        return _measure_with_cuda(fn, device)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _allocator_events(fn: Callable[[], T]) -> tuple[T, list[int]]:
    """Run ``fn()`` under the profiler; return its result and the signed sizes of every
    allocation (+) and free (-) made through c10's CPU allocator, in time order."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _stderr_silenced():  # kineto logs a line to fd 2 at every start and stop
        prof.start()
    try:
        result = fn()
    finally:
        with _stderr_silenced():
            prof.stop()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())  # stable: same-ns events keep their recorded order
    return result, [event.nbytes() for event in events]


def allocation_trace(fn: Callable[[], T]) -> tuple[T, list[int]]:
    """Run ``fn()`` once on CPU; return its result and the live extra bytes after each allocator event.

    The x-axis of a memory-over-time plot: event order is deterministic for a
    given call, unlike timestamps on a shared machine.
    """
    result, sizes = _allocator_events(fn)
    live, trace = 0, []
    for nbytes in sizes:
        live += nbytes
        trace.append(live)
    return result, trace


def _measure_with_profiler(fn: Callable[[], T]) -> tuple[T, MemoryMeasurement]:
    result, events = _allocator_events(fn)
    live = peak = 0
    sizes: Counter[int] = Counter()  # live allocations by size: a free releases one of its size
    at_peak: Counter[int] = Counter()
    for nbytes in events:
        live += nbytes
        if nbytes > 0:
            sizes[nbytes] += 1
        elif sizes[-nbytes] > 0:
            sizes[-nbytes] -= 1
        if live > peak:
            peak, at_peak = live, sizes.copy()
    live_sizes = tuple(sorted(at_peak.elements(), reverse=True))
    return result, MemoryMeasurement(peak, live, "profiler", live_sizes)


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null (C++ logging bypasses ``sys.stderr``)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _measure_with_memray(fn: Callable[[], T]) -> tuple[T, MemoryMeasurement]:
    try:
        import memray
    except ImportError as error:  # pragma: no cover - memray is an analysis extra
        raise RuntimeError("method='memray' needs the memray package (pip install memray)") from error
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "capture.bin")
        with memray.Tracker(path):
            result = fn()
        reader = memray.FileReader(path)
        peak = int(reader.metadata.peak_memory)
        end = sum(r.size for r in reader.get_leaked_allocation_records(merge_threads=True))
    return result, MemoryMeasurement(peak, int(end), "memray")


def _measure_with_cuda(fn: Callable[[], T], device: torch.device | str | None) -> tuple[T, MemoryMeasurement]:
    if not torch.cuda.is_available():
        raise RuntimeError("method='cuda' needs a CUDA device; torch.cuda.is_available() is False")
    device = torch.device("cuda") if device is None else torch.device(device)
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - start
    end = torch.cuda.memory_allocated(device) - start
    return result, MemoryMeasurement(int(peak), int(end), "cuda")
