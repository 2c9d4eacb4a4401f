"""The decision procedure and the models it consults: which options, at what predicted memory, error and time.

``procedure`` (candidates, the rule's conditions, the objective, "auto"'s derivation; re-exported here as
``lce.decide``), ``error_model`` and ``time_model`` (with their fitted constants, JSON beside them) and
``recommendation`` (:func:`lce.recommend`).
"""

from .procedure import *  # noqa: F403 (the procedure is this package's face)
from .procedure import __all__  # noqa: F401
