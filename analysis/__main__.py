"""``python -m analysis``: see :mod:`analysis.cli`."""

from analysis.cli import main

raise SystemExit(main())
