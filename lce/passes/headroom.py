"""Power-of-two headroom for fp16 gradients, so that a loss scale protects them.

fp16's normal numbers start at 6.1e-5. For "mean" and "sum" lce forms the gradients in forward, before the
incoming gradient (a loss scale, under ``torch.amp.GradScaler``) is known; formed at their true size, a rare
class's weight-gradient entries (about ``p / N``) fall below that range and are rounded to subnormals or zero
before the scale could lift them, and compact's running fp16 sum loses them for good. So in fp16 every gradient is
formed *scaled* by a power of two that puts its largest entry near the top of fp16's range, and backward folds
the unscale into its multiply by the incoming gradient (:meth:`lce.passes.gradients.GradientScales.unscale_`: one
multiply by a
Python float, which torch's fp16 kernels compute in fp32 and round once, with no temporary).
Powers of two are exact: the scaled gradient holds the same digits as the unscaled one would, without the
underflow.

* A gradient whose sum is wider than fp16 (an fp32 accumulator, fp32 bias sums, a class-tiled input row's fp32
  sum) is scaled once, by its actual largest entry, when it is rounded (:func:`scale_to_fit`).
* A gradient written once per chunk from an fp16 GEMM result (the input gradient's rows; a weight-gradient chunk
  product rounded before an fp32 sum) is scaled per chunk from a bound on its entries (:func:`power_of_two_under`).
* A running fp16 sum (compact's weight gradient) keeps an upper bound on its largest entry; when the next product
  could push it past :data:`SUM_LIMIT` the bound is replaced by the measured maximum, and if that is not enough the
  whole sum is divided by a power of two (:class:`RunningSum`), so it ends with its largest entry within a factor
  of four of the top.

The returned gradient is then the fp32 product ``stored * (incoming / scale)`` rounded once to fp16, ``stored``
itself one rounding of the sum: one rounding more than a gradient formed at its final size. When the incoming
gradient is a power of two (GradScaler's scales are; 1 without a scaler) that second rounding changes nothing where
the result is a normal fp16 number; below fp16's normal range (6.1e-5) it can: the stored value carries 11
significant bits and the subnormal grid at most 10, so such an entry lands within 3/4 of a subnormal step (2^-24)
instead of 1/2 (``tests/lce/test_loss_scale.py``). That is the price of the headroom for a "mean" loss with no loss
scale whose gradients are mostly subnormal (1.13 floors of the input gradient at 1024x1024x8192, 12% of its entries a
step off); a loss scale lifts them out of that range, which is the case the headroom exists for. Inf and NaN
propagate: a loss scale too large for the gradients overflows in that product, as GradScaler expects.
"""

from __future__ import annotations

import math

import torch

__all__ = ["STORE_LIMIT", "SUM_LIMIT", "power_of_two_under", "largest_entry", "scale_to_fit",
           "RunningSum"]

STORE_LIMIT = 2.0 ** 15
"""The largest entry a scaled fp16 gradient is stored at (fp16's largest finite number is 65504)."""

SUM_LIMIT = 2.0 ** 14
"""A running fp16 sum is kept below this, so that one more product cannot overflow it."""

_MIN_EXPONENT, _MAX_EXPONENT = -126, 126


def power_of_two_under(limit: float, bound: float) -> float:
    """The largest power of two ``s`` with ``s * bound <= limit``; 1.0 for a bound that is 0 or not finite."""
    if not (bound > 0 and math.isfinite(bound)):
        return 1.0
    exponent = math.floor(math.log2(limit / bound))
    return 2.0 ** min(max(exponent, _MIN_EXPONENT), _MAX_EXPONENT)


def largest_entry(tensor: torch.Tensor) -> float:
    """``max |tensor|`` as a float (0.0 for an empty tensor), without an elementwise temporary."""
    if tensor.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(tensor, ord=math.inf))


def scale_to_fit(wide: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """``wide`` (a wider sum) rounded to ``dtype`` after scaling by the power of two that puts its largest entry
    at most :data:`STORE_LIMIT`; ``wide`` is scaled in place. Returns the rounded tensor and the scale."""
    scale = power_of_two_under(STORE_LIMIT, largest_entry(wide))
    if scale != 1.0:
        wide.mul_(scale)
    return wide.to(dtype), scale


class RunningSum:
    """The scale of a running sum in a narrow dtype (a (C, D) fp16 buffer that chunk products are added to).

    :meth:`scale_for` is called before each add with a bound on the product's entries (unscaled) and returns the
    scale to multiply that product by; the sum's current scale is :attr:`scale`."""

    def __init__(self, buffer: torch.Tensor):
        self.buffer = buffer
        self.scale: float | None = None
        self._bound = 0.0  # an upper bound on max |buffer|, at the current scale

    def scale_for(self, product_bound: float) -> float:
        if self.scale is None:
            self.scale = power_of_two_under(SUM_LIMIT, product_bound)
        added = self.scale * product_bound
        if self._bound + added > SUM_LIMIT and math.isfinite(added):
            self._bound = largest_entry(self.buffer)
            if self._bound + added > SUM_LIMIT:
                shrink = power_of_two_under(SUM_LIMIT, self._bound + added)
                self.buffer.mul_(shrink)
                self.scale *= shrink
                self._bound *= shrink
                added *= shrink
        self._bound += added
        return self.scale

