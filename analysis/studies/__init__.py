"""One-off studies: each answers one question at one problem, next to the grid sweeps.

* :mod:`analysis.studies.demo` -- ``python -m analysis demo``: the resolved plan, then lce's and
  torch's errors against fp64 per policy;
* :mod:`analysis.studies.bench` -- speed and peak memory at one problem, the chunk-size sweep and
  the scaling in N and C (``bench.csv``, ``bench_chunks.csv``);
* :mod:`analysis.studies.fp64_checks` -- gradcheck and reference-path parity of every chunked path
  (notebook 01);
* :mod:`analysis.studies.growth` -- error against the number of chunks, with a fitted power law
  (notebook 02);
* :mod:`analysis.studies.defects` -- torch's loss drift and all-ignored gradients next to lce's
  (notebook 02);
* :mod:`analysis.studies.memory_study` -- lce's planned buffers and a measured memory trace
  (``memory_breakdown.csv``, ``memory_trace.csv``; notebook 03);
* :mod:`analysis.studies.margins` -- error on confident rows against the target's lead, 0-40 nats
  (``margins.csv``);
* :mod:`analysis.studies.rare_rows` -- weight-gradient row error binned by how often the class is a
  target (``rare_rows.csv``); both run their contenders through :mod:`analysis.studies.peers`.

Every study runs its implementations through :mod:`analysis.implementations`.
"""
