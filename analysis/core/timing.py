"""Wall time of a call: the median of repeats after warm-up.

On CUDA each repeat is timed with a pair of CUDA events around the call (the
GPU's own clock, no host-side launch jitter) and the device is synchronized
before reading them; on the CPU with :func:`time.perf_counter`. The median,
not the mean, because other processes on a shared machine add one-sided
outliers.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["Timing", "time_call"]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call: the median and every repeat."""

    median_s: float
    repeats_s: tuple[float, ...]

    @property
    def spread_s(self) -> float:
        """Max minus min over the repeats (a noise indicator)."""
        return max(self.repeats_s) - min(self.repeats_s)


def time_call(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5,
              device: torch.device | str = "cpu") -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return the median."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(stop) / 1e3)
    else:
        for _ in range(repeats):
            begin = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin)
    return Timing(statistics.median(samples), tuple(samples))
