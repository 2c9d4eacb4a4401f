"""The user-facing options of the chunked path: fields, defaults, validation.

Nothing here depends on a device or a call; :mod:`lce.planning.plan` resolves the
``"auto"`` sentinels and the chunk size against one concrete call.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

__all__ = ["LinearCrossEntropyOptions", "ACC_POLICIES", "EXPLICIT_POLICIES", "ACC_DTYPES", "dtype_name",
           "parse_chunking_method"]

EXPLICIT_POLICIES: tuple[str, ...] = ("accurate", "balanced", "compact")
"""The policies a layout table defines, from most to least precise."""
ACC_POLICIES: tuple[str, ...] = ("auto", *EXPLICIT_POLICIES)
"""Every accepted value of :attr:`LinearCrossEntropyOptions.acc_policy`."""

ACC_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""Every accepted explicit value of :attr:`LinearCrossEntropyOptions.acc_dtype`."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how plans, results files and figures name a dtype."""
    return str(dtype).removeprefix("torch.")


def parse_chunking_method(method: str) -> int:
    """Return the divisor ``N`` of ``"aspect_ratio"`` / ``"aspect_ratio:N"``.

    Raises ``ValueError`` for any other spelling (``"auto"`` included: it is a
    sentinel, resolved before a divisor is needed).
    """
    name, colon, divisor = method.partition(":")
    if name == "aspect_ratio" and not colon:
        return 1
    if name == "aspect_ratio" and divisor.isdigit() and int(divisor) >= 1:
        return int(divisor)
    raise ValueError(
        f"chunking_method must be 'auto', 'aspect_ratio', 'aspect_ratio:N' with an integer "
        f"N >= 1, or None; got {method!r}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class LinearCrossEntropyOptions:
    """Opt-in settings for the chunked :func:`lce.linear_cross_entropy`.

    Passing an instance (even ``LinearCrossEntropyOptions()``) selects the
    chunked path, which walks the batch in row chunks so that the full
    ``(N, C)`` logits never exist at once. ``options=None`` selects the plain
    reference formula instead.

    Attributes:
        allow_retain_graph: for ``reduction`` ``"mean"``/``"sum"`` the
            gradients are computed during forward and handed out by backward.
            ``False`` scales them in place, so a second backward raises
            ``RuntimeError``; ``True`` keeps them and pays one extra
            gradient-sized allocation per backward. ``"none"`` ignores it:
            its backward recomputes, so repeated backward always works.
        batch_chunk_size: rows per chunk. ``None`` means "let
            :attr:`chunking_method` decide", or one chunk if that is ``None``.
            Setting it while :attr:`chunking_method` is ``"auto"`` switches the
            heuristic off; combining it with an explicit method that yields a
            different size is a ``ValueError`` at call time.
        chunking_method: ``"auto"`` (a per-(device, dtype) pick, see
            :data:`lce.planning.policies.AUTO_TABLE`), ``"aspect_ratio"`` (a chunk's
            ``(rows, C)`` logits take about as many elements as the whole
            ``(N, D)`` input: rows = next power of two of
            ``ceil(N / ceil(C / D))``), ``"aspect_ratio:N"`` (that size divided
            by ``N``), or ``None`` (use :attr:`batch_chunk_size`).
        acc_policy: which buffers use :attr:`acc_dtype` and whether a
            ``(C, D)`` weight-gradient accumulator is kept; one of
            ``"auto"``, ``"accurate"``, ``"balanced"``, ``"compact"``. The
            layouts are tabulated in :mod:`lce.planning.policies`.
        acc_dtype: dtype of the accumulations. ``None`` resolves per call:
            fp32 for fp16/bf16 input when ``acc_policy="auto"`` and the device
            has a mixed-precision matmul (CPU, CUDA sm70+/sm80+), otherwise
            the input dtype.
        class_chunk_size: lce only (torch's options have no such field).
            ``None`` (the default, torch's behaviour) gives each chunk of rows
            all ``C`` logits at once. An int cuts the vocabulary into blocks of
            that many classes as well: a row chunk's log-sum-exp is gathered
            block by block (a running maximum and a rescaled sum of
            exponentials), then each block's logits are computed again for the
            gradients. Peak memory then holds ``(rows, class_chunk_size)``
            logits instead of ``(rows, C)``, at the price of computing the
            logits twice; :func:`lce.recommend` picks it when a memory budget
            needs it.
        batch_invariant: lce only. Whether each row's outputs -- its loss,
            log-probability, entropy and log-sum-exp, and its input gradient
            under reduction ``"sum"`` or ``"none"`` -- are a bitwise function
            of that row, the head, the options, the dtype and the device kind,
            whatever else the batch holds (its size, the other rows, their
            order, padding rows with ``ignore_index``). ``True``: every chunk
            has the same number of rows (``batch_chunk_size``, or the auto
            table's fixed rows, rounded up to a multiple of 64; never the
            aspect ratio, which follows N), the last one padded with ignored
            rows, so every GEMM and statistic runs at one shape; in fp16
            dz also stays fp32 for the backward GEMMs and the gradients are
            formed at their true size (their power-of-two scales would follow
            the batch), which is slower on CUDA. ``False``: chunks follow N.
            ``None`` (the default): ``True`` for :func:`lce.linear_log_probs`
            (the RL entry point; the TRL route inherits it) and, for the loss,
            where "auto" sizes the chunks and the auto table's entry for the
            device kind and dtype says so (fixed chunks cost at most 5% time
            and memory there, docs/policies.md); never in fp16 or with an
            explicit ``chunking_method``, and, for the loss, not where
            ``batch_chunk_size`` or ``chunking_method=None`` sizes the chunks
            as torch's options do. A padded last chunk costs up to one chunk
            of extra rows (for N below the chunk's rows, the chunk's time).
            ``lce.plan`` says which, and why.
    """

    allow_retain_graph: bool = False
    batch_chunk_size: int | None = None
    chunking_method: str | None = "auto"
    acc_policy: Literal["accurate", "balanced", "compact", "auto"] = "auto"
    acc_dtype: torch.dtype | None = None
    class_chunk_size: int | None = None
    batch_invariant: bool | None = None

    def __post_init__(self) -> None:
        if self.acc_policy not in ACC_POLICIES:
            raise ValueError(f"acc_policy must be one of {ACC_POLICIES}, got {self.acc_policy!r}")
        if self.chunking_method is not None and self.chunking_method != "auto":
            if not isinstance(self.chunking_method, str):
                raise ValueError(f"chunking_method must be a str or None, got {self.chunking_method!r}")
            parse_chunking_method(self.chunking_method)
        for name in ("batch_chunk_size", "class_chunk_size"):
            size = getattr(self, name)
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                raise ValueError(f"{name} must be a positive int or None, got {size!r}")
        if self.batch_invariant is not None and not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True, False or None, got {self.batch_invariant!r}")
        if self.acc_dtype is not None and self.acc_dtype not in ACC_DTYPES:
            raise ValueError(
                f"acc_dtype must be None or one of {ACC_DTYPES}, got {self.acc_dtype!r}; "
                "None picks one per call"
            )

    @classmethod
    def coerce(cls, options: object) -> LinearCrossEntropyOptions:
        """Accept an lce options object or torch's ``nn.LinearCrossEntropyOptions``.

        torch's class has the first five fields, so a user switching from
        ``torch.nn.functional.linear_cross_entropy`` keeps their options (and
        gets lce's own fields' defaults: ``class_chunk_size=None``, torch's behaviour, and
        ``batch_invariant=None``).
        """
        if isinstance(options, cls):
            return options
        torch_class = getattr(torch.nn, "LinearCrossEntropyOptions", None)
        if torch_class is not None and isinstance(options, torch_class):
            return cls(**{name: getattr(options, name) for name in _field_names(torch_class)})
        raise TypeError(
            "options must be None or a LinearCrossEntropyOptions (lce's or torch.nn's), "
            f"got {type(options).__name__}"
        )

    def to_torch(self) -> object:
        """The same settings as torch's ``nn.LinearCrossEntropyOptions`` (the peer the analysis runs).

        ``RuntimeError`` on a torch without that class (it arrived in 2.13);
        ``ValueError`` when ``class_chunk_size`` is set, which torch cannot express (``batch_invariant`` is
        lce's own and is left out: torch's op gives no such guarantee).
        """
        if self.class_chunk_size is not None:
            raise ValueError(f"class_chunk_size={self.class_chunk_size} is lce-only; torch's options have no "
                             "vocabulary tiling")
        torch_class = getattr(torch.nn, "LinearCrossEntropyOptions", None)
        if torch_class is None:
            raise RuntimeError(f"torch {torch.__version__} has no torch.nn.LinearCrossEntropyOptions")
        return torch_class(**{name: getattr(self, name) for name in _field_names(torch_class)})


def _field_names(options_class: type) -> list[str]:
    return [field.name for field in dataclasses.fields(options_class)]
