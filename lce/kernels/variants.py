"""Every compile variant of :mod:`lce.kernels`' Triton kernels that lce can launch (plain Python: no triton import).

A Triton kernel is compiled once per combination of its ``tl.constexpr`` arguments, argument types and launch
options, and only those compilations can fail to type-check or to generate code. Triton's CPU interpreter, which
the kernel tests run, compiles nothing, so this module names what a GPU would compile, for whatever compiles it:
the cross-compilation check (:mod:`lce.kernels.cross_compile`, on any machine) and a GPU's smoke step.

Contract of :func:`variants`: for each kernel of :mod:`lce.kernels.softmax_passes`, each combination of its
constexprs that the public functions of :mod:`lce.kernels` can launch with their default launches
(:func:`lce.kernels.launch.statistics_launch` and :func:`~lce.kernels.launch.grad_launch`, which every caller in
lce uses), once, with the ``num_warps`` that launch picks for its ``BLOCK``, and the Triton type of each runtime
argument as those functions pass it. The rules below restate, flag by flag, how :mod:`lce.kernels` and the launch
code of :mod:`lce.kernels.softmax_passes` turn their arguments into constexprs; ``tests/lce/test_kernels_compile.py``
records the launches the public functions actually make for every combination of their optional arguments and
checks they are exactly these, so the two cannot drift apart unnoticed.

Not enumerated: an explicit ``launch=`` of another shape (the caller's choice, compiled when it is launched);
integer arguments of ``2**31`` or more (Triton types them ``i64``; a chunk would need that many columns); and
Triton's value specializations at launch (an integer argument equal to 1 becomes a constant, integers divisible by
16 and pointers aligned to 16 bytes get divisibility hints): they change the generated loads, not which branches
exist, and the variants here are each branch's general code.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator

import torch

from .interpreter import libdevice_exp
from .launch import Launch, grad_launch, statistics_launch

__all__ = ["Variant", "variants", "KERNELS", "SIGNATURES"]

KERNELS = ("row_statistics_kernel", "grad_logits_kernel")
"""The kernels of :mod:`lce.kernels.softmax_passes`, by name."""

_FP32, _INT64, _I32 = "*fp32", "*i64", "i32"

SIGNATURES: dict[str, tuple[tuple[str, str], ...]] = {
    # Every pointer argument is an fp32 tensor but the targets: the public functions check z, the per-row vectors
    # and the class weights are fp32 and the target indices int64, and where an optional tensor is absent the
    # launch passes an fp32 one of its own in its place (z, a row vector). The integers are the row stride, the
    # column count and the blocks per split, Python ints below 2**31 for any chunk of fewer than 2**31 columns,
    # which Triton types i32.
    "row_statistics_kernel": (
        ("z_ptr", _FP32), ("z_row_stride", _I32), ("num_cols", _I32),
        ("target_ptr", _INT64),
        ("start_ptr", _FP32),
        ("class_weight_ptr", _FP32),
        ("max_ptr", _FP32), ("other_ptr", _FP32), ("weighted_ptr", _FP32),
        ("target_logit_ptr", _FP32),
        ("blocks_per_split", _I32),
    ),
    "grad_logits_kernel": (
        ("z_ptr", _FP32), ("z_row_stride", _I32), ("num_cols", _I32),
        ("target_ptr", _INT64),
        ("shift_ptr", _FP32), ("divisor_ptr", _FP32),
        ("prob_coef_ptr", _FP32), ("target_coef_ptr", _FP32), ("other_prob_ptr", _FP32),
        ("smoothing_ptr", _FP32), ("class_weight_ptr", _FP32),
    ),
}
"""Each kernel's runtime (non-constexpr) arguments in parameter order, with the Triton type every launch gives."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compilation of one kernel: ``kernel`` (a name in :data:`KERNELS`), ``constexprs`` as ``(name, value)``
    pairs in the kernel's parameter order (``BLOCK`` an int, the flags bools), ``signature`` the runtime arguments'
    ``(name, Triton type)`` pairs in parameter order (``"*fp32"``, ``"*i64"``, ``"i32"``), and ``num_warps``.
    Hashable and ordered by its fields."""

    kernel: str
    constexprs: tuple[tuple[str, int | bool], ...]
    signature: tuple[tuple[str, str], ...]
    num_warps: int

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"Variant.kernel must be one of {KERNELS}, got {self.kernel!r}")

    @property
    def constexpr_values(self) -> dict[str, int | bool]:
        """``constexprs`` as a dict (name to value), as a launch passes them as keywords."""
        return dict(self.constexprs)

    @property
    def block(self) -> int:
        """The ``BLOCK`` constexpr: columns per step."""
        return self.constexpr_values["BLOCK"]

    @property
    def name(self) -> str:
        """A readable unique name: ``grad_logits_kernel[BLOCK=256,DIVIDE=1,...,num_warps=4]`` (flags as 0 or 1)."""
        values = ",".join(f"{name}={int(value)}" for name, value in self.constexprs)
        return f"{self.kernel}[{values},num_warps={self.num_warps}]"

    def __str__(self) -> str:
        return self.name


def variants() -> tuple[Variant, ...]:
    """Every compile variant lce can launch (the module's contract), the statistics kernel's first, each kernel's
    ordered by ``BLOCK`` and then by flags. A fresh tuple each call; the same variants every call."""
    return (*_kernel_variants("row_statistics_kernel", statistics_launch, _statistics_flags()),
            *_kernel_variants("grad_logits_kernel", grad_launch, _grad_flags()))


_LaunchFor = Callable[[int, int, torch.device], Launch]
"""A default launch function of :mod:`lce.kernels.launch`: (rows, columns, device) to a launch."""


def _kernel_variants(kernel: str, launch_for: _LaunchFor, flag_sets: list[dict[str, bool]]) -> Iterator[Variant]:
    for launch in _default_launches(launch_for):
        for flags in flag_sets:
            # BLOCK first and LIBDEVICE_EXP last, the kernels' parameter order
            constexprs = {"BLOCK": launch.block, **flags, "LIBDEVICE_EXP": libdevice_exp(interpreted=False)}
            yield Variant(kernel, tuple(constexprs.items()), SIGNATURES[kernel], launch.num_warps)


def _default_launches(launch_for: _LaunchFor) -> list[Launch]:
    """The (block, num_warps) shapes a default launch function picks, one per block, narrowest first.

    A launch's block and warps depend on the column count alone (its rows and SM count set only the splits), and
    the block is the power of two covering the columns, clipped to the launch's range: so the column counts 2**k,
    for every k an i32 column count allows, reach every block the function can pick.
    """
    cpu = torch.device("cpu")
    shapes = {}
    for log2_cols in range(31):
        launch = launch_for(1, 2**log2_cols, cpu)
        shapes[launch.block] = Launch(launch.block, launch.num_warps)
    return [shapes[block] for block in sorted(shapes)]


def _statistics_flags() -> list[dict[str, bool]]:
    """The flag sets :func:`lce.kernels.row_statistics` and :func:`lce.kernels.sum_apart_from_target` lead to.

    As :mod:`lce.kernels` calls :func:`lce.kernels.softmax_passes.row_statistics`: ``row_statistics`` with no
    fixed shift, ``running_max`` as the start, and class weights only with the weighted sum; ``sum_apart_from_target``
    with a fixed shift (its ``shift``, always given), no class weights and no weighted sum.
    """
    calls = [dict(fixed_shift=False, start_given=running_max, class_weight_given=class_weight and weighted_sum,
                  weighted_sum=weighted_sum)
             for running_max, weighted_sum, class_weight in itertools.product((False, True), repeat=3)]
    calls.append(dict(fixed_shift=True, start_given=True, class_weight_given=False, weighted_sum=False))
    # ... and as softmax_passes.row_statistics turns its arguments into the kernel's flags
    return _unique([dict(FIXED_SHIFT=call["fixed_shift"],
                         HAS_START=call["start_given"] and not call["fixed_shift"],
                         WEIGHTED_SUM=call["weighted_sum"],
                         CLASS_WEIGHT=call["class_weight_given"])
                    for call in calls])


def _grad_flags() -> list[dict[str, bool]]:
    """The flag sets :func:`lce.kernels.grad_logits_` leads to: a divisor or not; a smoothing coefficient or not;
    class weights kept only with the smoothing coefficient (the smoothing term is their one use)."""
    calls = [dict(divisor_given=divisor, smoothing_given=smoothing, class_weight_given=class_weight and smoothing)
             for divisor, smoothing, class_weight in itertools.product((False, True), repeat=3)]
    # ... and as softmax_passes.grad_logits_ turns its arguments into the kernel's flags
    return _unique([dict(DIVIDE=call["divisor_given"], SMOOTHING=call["smoothing_given"],
                         CLASS_WEIGHT=call["class_weight_given"])
                    for call in calls])


def _unique(flag_sets: list[dict[str, bool]]) -> list[dict[str, bool]]:
    """``flag_sets`` without repeats, in sorted order (False before True, flag by flag)."""
    return [dict(items) for items in sorted({tuple(flags.items()) for flags in flag_sets},
                                            key=lambda items: [value for _, value in items])]
