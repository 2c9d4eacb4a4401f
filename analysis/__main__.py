"""``python -m analysis``: see :mod:`analysis.cli`."""

from .cli import main

raise SystemExit(main())
