"""How lce's ops meet ``torch.compile``: each is a graph break, its chunk loop runs eagerly.

``torch.compiler.disable`` marks a function so that Dynamo does not trace into it, but applying it imports
torch's compiler stack (``torch._dynamo``: about 1.5 s), which every ``import lce`` would then pay, in every
process (test workers, the ranks of a process group, notebook kernels). :func:`graph_break` applies it at a call
instead, and only once ``torch._dynamo`` is loaded: until then nothing in the process can be compiling (any
``torch.compile`` imports it first), so the function runs as it is and an eager-only process never imports it.

The orders a compiled caller can meet it in (``tests/lce/test_autograd.py`` checks each in a fresh process,
compiled against eager, loss and gradients):

* called eagerly after ``torch._dynamo`` was loaded: the disabled function is made then, and Dynamo, tracing the
  wrapper later, meets a function wrapped by ``torch.compiler.disable`` and breaks the graph at the call to it;
* traced first: Dynamo reaches the ``torch.compiler.disable(fn)`` line, a call it does not trace (it is in its
  skip list), so it breaks the graph there and runs that line eagerly, then breaks again at the disabled
  function. The first compiled call costs the wrapper one more graph break and, once the disabled function
  exists, one recompilation of the wrapper's frame (its closure cell is guarded); neither traces into ``fn``.

Not applied at import when ``torch._dynamo`` happens to be loaded already, so one path serves every process.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["graph_break"]

F = TypeVar("F", bound=Callable)


def graph_break(fn: F) -> F:
    """``fn`` as ``torch.compiler.disable(fn)`` would be, the disabling done at the first call that finds
    ``torch._dynamo`` loaded; before that ``fn`` itself runs (no compilation can be under way)."""
    disabled: Callable | None = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call  # type: ignore[return-value]
