"""A `.kfc` file as data: the op, its check block (the reference, the cases, tolerances, seeds and
input generators), its metric and targets. The front end builds it; the check runner, the
compiler, the runtime, the knowledge base and the factory read it."""

from __future__ import annotations

import re
from typing import Any

import attrs

from ..diagnostics import Span

DEFAULT_TOLERANCE = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-5, "f64": 1e-10, "e4m3": 1.3e-1, "e5m2": 2.5e-1,
                     "i8": 0.0, "u8": 0.0, "i32": 0.0, "i64": 0.0, "bool": 0.0, "index": 0.0}


@attrs.frozen
class GeneratorSpec:
    """How to draw one input: a generator's name and its arguments (numbers or dim names)."""

    name: str
    args: tuple[Any, ...] = ()
    span: Span | None = attrs.field(default=None, eq=False)


@attrs.frozen
class CheckSpec:
    reference: str | None = None
    reference_span: Span | None = attrs.field(default=None, eq=False)
    shapes: tuple[dict[str, int], ...] = ()
    tolerance: dict[str, float] = attrs.Factory(dict)
    seeds: tuple[int, ...] = (0,)
    inputs: dict[str, GeneratorSpec] = attrs.Factory(dict)
    # where the reference runs when an output is exact (integers, bools, fp8) and the kernel on a
    # GPU: "cpu" (torch on the CPU decides the bits) or "device" (torch beside the kernel)
    exact_reference: str = "cpu"
    span: Span | None = attrs.field(default=None, eq=False)  # the check block itself

    @property
    def reference_is_function(self) -> bool:
        return self.reference is not None and bool(re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.reference))

    def tolerance_for(self, dtype: str) -> float:
        return self.tolerance.get(dtype, DEFAULT_TOLERANCE.get(dtype, 1e-5))


@attrs.frozen
class MetricSpec:
    kind: str = "time"
    formula: str | None = None  # flops: constant expression over dims; bandwidth: bytes (optional)


@attrs.frozen
class OpSpec:
    func: Any                  # the op as a verified kfc.ir FuncOp
    path: str
    check: CheckSpec | None = None
    metric: MetricSpec = MetricSpec()
    targets: tuple[str, ...] = ()
    type_params: tuple[tuple[str, tuple[str, ...]], ...] = ()   # (T, (bf16, f16, f32)), ...
    dtypes: dict[str, str] = attrs.Factory(dict)                 # what this instance binds them to
    typed_params: dict[str, str] = attrs.Factory(dict)           # parameter -> its type parameter
    text: str = attrs.field(default="", repr=False, eq=False)

    @property
    def name(self) -> str:
        return self.func.sym_name

    @property
    def sizes(self) -> dict[str, int]:
        """The size type parameters this instance binds (C of kda<C: 64 | 32 | 16>), by name."""
        return {n: int(self.dtypes[n]) for n, opts in self.type_params if opts[0].isdigit() and n in self.dtypes}

    @property
    def smaller_sizes(self) -> dict[str, int]:
        """For each size type parameter bound above the least size it offers, the next smaller
        one (C of kda<C: 64 | 32 | 16> bound to 64: 32): what to bind where a tile is too large."""
        out = {}
        for n, opts in self.type_params:
            if opts[0].isdigit() and n in self.dtypes:
                below = [int(o) for o in opts if int(o) < int(self.dtypes[n])]
                if below:
                    out[n] = max(below)
        return out

    @property
    def instance_name(self) -> str:
        """The op's name with its type arguments, e.g. rmsnorm_f16."""
        return "_".join([self.name] + [self.dtypes[n] for n, _ in self.type_params])
