"""One run of a sweep: which op with which options on which problem (one CSV row).
"""

from __future__ import annotations

import dataclasses

from analysis.core.families import parse_family
from analysis.core.implementations import ImplSpec
from analysis.core.problem import Shape


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run: which op with which options, on which problem. One CSV row.

    ``acc_dtype`` is ``"default"`` (the options' ``None``) or a dtype name;
    ``policy``/``chunking`` are ``""`` for the unchunked ops.
    """

    op: str
    dtype: str
    N: int
    D: int
    C: int
    policy: str = ""
    chunking: str = ""
    acc_dtype: str = "default"
    bias: bool = True
    device: str = "cpu"
    family: str = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        parse_family(self.family)

    @property
    def shape(self) -> Shape:
        return Shape(self.N, self.D, self.C)

    @property
    def key(self) -> str:
        """Stable identity of the run; a sweep skips keys its CSV already holds."""
        return "|".join(str(getattr(self, f.name)) for f in dataclasses.fields(self))

    @property
    def spec(self) -> ImplSpec:
        """The implementation this run measures."""
        return ImplSpec(self.op, self.policy, self.chunking, self.acc_dtype)

    def inputs_key(self) -> tuple:
        """Runs with equal inputs keys share inputs and the fp64 reference."""
        return (self.device, self.dtype, self.N, self.D, self.C, self.bias, self.family, self.seed)

    @property
    def errors_only(self) -> bool:
        """Runs whose memory and time are not measured: lce's CUDA layouts emulated on CPU tensors (their
        memory is lce's model, their time the CPU stand-in's, meaningless for CUDA)."""
        return self.device == "cuda-emulated"
