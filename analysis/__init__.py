"""analysis: measure what each precision policy of ``lce`` costs and buys.

Modules, in data-flow order (see ``../README.md``, "How the code is laid out"):

* :mod:`analysis.paths` -- where results, figures and notebooks live;
* :mod:`analysis.grids` -- the named grids of runs;
* :mod:`analysis.inputs` -- the inputs of one run and the outputs it returns;
* :mod:`analysis.reference` -- fp64 loss and gradients on the same rounded inputs;
* :mod:`analysis.metrics` -- relative errors and rounding floors;
* :mod:`analysis.memory`, :mod:`analysis.timing` -- measured peak memory and time;
* :mod:`analysis.implementations` -- every compared callable behind one signature;
* :mod:`analysis.sweep` -- runs a grid into a resumable CSV with provenance;
* :mod:`analysis.pareto`, :mod:`analysis.plots` -- fronts, verdicts, figures.

``python -m analysis --help`` lists the commands. ``lce`` never imports this package.
"""
