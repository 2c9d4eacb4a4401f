"""One module per study: each answers one question (at one problem, or over a few), writes its own results
file with provenance, and registers its command with :mod:`analysis.cli`. Every study runs its
implementations through :mod:`analysis.core.implementations` and judges errors against
:mod:`analysis.core.fp64`; none imports :mod:`analysis.report`."""
