"""lce-lab's research code: what each precision policy of :mod:`lce` costs in memory and time and buys in accuracy.

One folder per job, and imports run one way (``core`` <- ``sweep``/``studies``/``lm`` <- ``judge`` <- ``report``
<- ``cli``; ``gpu`` drives the measurements on a lent GPU):

* :mod:`analysis.core` -- the problem, inputs and input families, the compared implementations, the fp64
  reference, error metrics, measured memory and time, provenance, results files;
* :mod:`analysis.sweep` -- the named grids and the resumable runner that measures them;
* :mod:`analysis.studies` -- one module per study (bench, noise, training, margins, budgets, ...), each writing
  its own results file;
* :mod:`analysis.lm` -- the small language model behind the ``trained`` input family;
* :mod:`analysis.judge` -- Pareto fronts and the error/noise rule that judge the "auto" table;
* :mod:`analysis.report` -- figures, tables, README blocks and one module per notebook;
* :mod:`analysis.gpu` -- the one command a lent GPU runs, and its wheels;
* :mod:`analysis.cli` -- ``python -m analysis``; :mod:`analysis.paths` -- where data and figures live.

``lce`` never imports this package.
"""
