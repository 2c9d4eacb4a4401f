"""Claims of notebook 01, each a named assertion over the same measurement the notebook makes (quick setting,
seeded: the same numbers on every run). A failure names the sentence to rewrite."""

from __future__ import annotations

import functools

from analysis.report import nb01_gradcheck
from analysis.studies import fp64_checks


@functools.cache
def _numbers():
    cases = fp64_checks.path_cases(quick=True)
    return (nb01_gradcheck.gradcheck_numbers(fp64_checks.gradcheck_table(cases)),
            nb01_gradcheck.parity_numbers(fp64_checks.parity_table(cases)))


def test_gradcheck_passes_on_every_chunked_path():
    """"gradcheck passed on {passed} of {paths} chunked paths: lce's analytic gradients are the derivatives of
    its own loss"."""
    gradcheck, _ = _numbers()
    assert gradcheck.paths > 0 and gradcheck.passed == gradcheck.paths, gradcheck.failed


def test_every_lce_path_agrees_with_the_reference_within_rounding():
    """"every chunked lce path agrees with the reference path to within {lce_worst} ... chunking changes
    nothing beyond rounding"."""
    _, exact = _numbers()
    assert exact.lce_worst < exact.tolerance, exact.per_output


def test_torch_agrees_where_it_chunks_and_falls_back_only_with_label_smoothing():
    """"torch 2.13's chunked op ... agrees as closely there; on the others, those with label smoothing, it fell
    back to its reference path"."""
    _, exact = _numbers()
    assert 0 < exact.torch_chunked_paths < exact.paths
    assert exact.torch_worst < exact.tolerance
    assert all("smoothing" in features for features in exact.torch_fallback_features)
