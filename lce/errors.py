"""The exception classes of lce's argument errors: each is both the class lce documents (``ValueError``,
``TypeError``) and the one torch 2.13's op raises for the same bad input (``RuntimeError`` for shapes, dtypes and
values; ``IndexError`` for a target out of range, as ``cross_entropy`` raises on the CPU), so code written around
either op -- ``except RuntimeError:`` around torch's, ``except ValueError:`` around lce's -- catches them.

The messages stay lce's: they name the argument, the value received and what was expected (torch's words differ;
docs/using-lce.md lists it among the differences).
"""

from __future__ import annotations

__all__ = ["ArgumentValueError", "ArgumentTypeError", "TargetIndexError", "TargetKindError"]


class ArgumentValueError(ValueError, RuntimeError):
    """A bad shape or value of an argument (torch's op: ``RuntimeError``)."""


class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type or dtype (torch's op: ``RuntimeError``)."""


class TargetIndexError(ArgumentValueError, IndexError):
    """A class-index target outside ``[0, C)`` that is not ``ignore_index`` (torch's ``cross_entropy`` on the CPU:
    ``IndexError``)."""


class TargetKindError(ArgumentTypeError, ArgumentValueError):
    """A target that is neither int64 class indices of the input's batch shape nor probabilities of the logits'
    shape: a floating-point target of another shape (torch's op: ``ValueError`` for a batch-size mismatch,
    ``RuntimeError`` elsewhere)."""
