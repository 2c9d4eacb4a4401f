"""lce: chunked fused linear + cross-entropy with explicit precision policies.

A drop-in, independent implementation of torch 2.13's
``torch.nn.functional.linear_cross_entropy`` and its options.
"""

from .decide.recommendation import Recommendation, recommend
from .functional import linear_cross_entropy, plan
from .logprobs import linear_log_probs
from .modules import LinearCrossEntropyLoss
from .planning.options import LinearCrossEntropyOptions
from .planning.plan import Plan

__version__ = "0.1.0"

__all__ = ["linear_cross_entropy", "linear_log_probs", "LinearCrossEntropyLoss", "LinearCrossEntropyOptions", "plan",
           "Plan", "recommend", "Recommendation"]
