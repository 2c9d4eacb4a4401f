"""A one-minute tour: the resolved plan, then lce's and torch's errors against fp64, per policy.

    python -m analysis demo [--rows 2048 --features 256 --classes 8192 --dtypes bfloat16 float16]

Inputs are the analysis' seeded inputs (:func:`analysis.core.inputs.make_inputs`),
rounded once to each dtype; the fp64 reference is computed from those same
rounded values, so every error below is the op's own. Errors are relative
Frobenius norms (:mod:`analysis.core.metrics`), also shown as multiples of the
rounding floor (the error of the exact answer merely rounded to the dtype).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from analysis.core.fp64 import reference_outputs
from analysis.core.implementations import ImplSpec, make_implementation, unavailable_reason
from analysis.core.inputs import OUTPUT_NAMES, make_inputs
from analysis.core.metrics import compare, rounding_floor
from analysis.core.problem import DTYPES, Shape
from lce.planning.options import EXPLICIT_POLICIES

__all__ = ["DEMO_SHAPE", "SETTINGS", "run_demo"]

DEMO_SHAPE = Shape(2048, 256, 8192)

SETTINGS: dict[str, tuple[str, str]] = {
    "auto": ("auto", "default"),
    **{f"{policy}, acc fp32": (policy, "float32") for policy in EXPLICIT_POLICIES},
}
"""Display name -> (acc_policy, acc_dtype) of the options compared; chunking is "auto" throughout."""


def run_demo(shape: Shape = DEMO_SHAPE, dtypes: tuple[str, ...] = ("bfloat16", "float16"),
             echo: Callable[[str], None] = print) -> None:
    """Print, per dtype, lce's default plan and a table of every output's error for lce and torch."""
    ops = [op for op in ("lce", "torch") if unavailable_reason(op, "cpu") is None]
    echo(f"N={shape.N} D={shape.D} C={shape.C}, one forward+backward on CPU per row; "
         f"error vs fp64 (multiple of the rounding floor)")
    for dtype in dtypes:
        inputs = make_inputs(shape, DTYPES[dtype])
        exact = reference_outputs(inputs)
        echo(f"\n{make_implementation(ImplSpec('lce', 'auto', 'auto')).plan(inputs)}\n")
        echo(f"{'implementation':<12} {'options':<22} {'time':>7}  " + "  ".join(f"{o:>18}" for o in OUTPUT_NAMES))
        floors = [rounding_floor(exact.get(name), DTYPES[dtype]) for name in OUTPUT_NAMES]
        echo(f"{'(floor)':<12} {'fp64 rounded to ' + dtype:<22} {'':>7}  " + "  ".join(f"{f:>18.2e}" for f in floors))
        for label, (policy, acc_dtype) in SETTINGS.items():
            for op in ops:
                implementation = make_implementation(ImplSpec(op, policy, "auto", acc_dtype))
                start = time.perf_counter()
                outputs = implementation.run(inputs)
                elapsed = time.perf_counter() - start
                reports = compare(outputs, exact)
                cells = [f"{reports[name].rel_fro:.2e} ({reports[name].fro_in_floors:4.1f}x)" for name in OUTPUT_NAMES]
                echo(f"{op:<12} {label:<22} {elapsed:6.2f}s  " + "  ".join(f"{c:>18}" for c in cells))


# ---- python -m analysis demo ---------------------------------------------------------------------------------

DESCRIPTION = ("Prints the resolved plan of lce's default options, then every output's error against fp64 "
               "(and as a multiple of its rounding floor) for lce and torch, per policy. Writes nothing.")


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, default=2048, help="N (default: 2048)")
    parser.add_argument("--features", type=int, default=256, help="D (default: 256)")
    parser.add_argument("--classes", type=int, default=8192, help="C (default: 8192)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], help="input dtypes")


def run(args) -> None:
    run_demo(Shape(args.rows, args.features, args.classes), tuple(args.dtypes))
