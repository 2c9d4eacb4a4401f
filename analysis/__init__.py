"""analysis: measure what each precision policy of ``lce`` costs and buys.

Modules, in data-flow order (see ``README.md`` here and ``../README.md``, "How the code is laid out"):

* :mod:`analysis.paths` -- where the results files and figures live;
* :mod:`analysis.grids` -- the named grids of runs;
* :mod:`analysis.inputs` -- the inputs of one call and the outputs it returns;
* :mod:`analysis.implementations` -- every compared op behind one signature;
* :mod:`analysis.reference` -- fp64 loss and gradients on the same rounded inputs; gradcheck;
* :mod:`analysis.metrics` -- relative errors and rounding floors;
* :mod:`analysis.memory`, :mod:`analysis.timing` -- measured peak memory and time;
* :mod:`analysis.provenance`, :mod:`analysis.results_io` -- provenance columns; the kinds of
  results files and their one writer;
* :mod:`analysis.sweep` -- runs a grid into a resumable results file;
* :mod:`analysis.lm` -- the ``trained`` input family: a small language model trained on the
  standard library's source, and its head's ``(x, W, y)`` dumps (``load_head_dump``);
* :mod:`analysis.studies` -- one-off studies (demo, bench, fp64 checks, growth, defects, memory,
  margins, rare rows, error against sampling noise, the training study);
* :mod:`analysis.decision` -- the error/noise rule every "auto" pick must meet, and the memory it trades;
* :mod:`analysis.pareto`, :mod:`analysis.plots`, :mod:`analysis.plots_matter`, :mod:`analysis.figures` --
  fronts and verdicts, figures drawn from results files (notebook 06's apart), the figures folder;
* :mod:`analysis.tables`, :mod:`analysis.conclusions` (and ``family_conclusions``, ``matter_conclusions``
  for notebooks 05 and 06) -- how the notebooks show tables, and the conclusion each notebook section
  ends with, written from its data;
* :mod:`analysis.notebooks`, :mod:`analysis.cli` -- the notebooks; ``python -m analysis``.

``python -m analysis --help`` lists the commands. ``lce`` never imports this package.
"""
