"""The named grids of runs (:mod:`~analysis.sweep.grids`), the resumable runner that measures them into a
results file (:mod:`~analysis.sweep.run`), and the re-measurement of rows after lce's memory use changed
(:mod:`~analysis.sweep.remeasure`)."""
