"""Verdicts over committed results: the error-memory-time Pareto fronts (:mod:`~analysis.judge.pareto`) and
the error/noise rule every "auto" pick must meet (:mod:`~analysis.judge.rule`), with their thresholds.
Reads results; measures and draws nothing."""
