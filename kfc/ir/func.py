"""`kfc.func`: one kernel. Its region's arguments are the inputs (tensors and scalars, in
declaration order) followed by the outputs (tensors in global memory, written by stores).

    kfc.func @rmsnorm(%x: bf16[M, N] @global, %w: f32[N] @global, %eps: f32 = 1e-06)
        -> (%y: bf16[M, N] @global) { ... }

A scalar input may have a default: a number, or a constant expression over the shape
symbols given as a string (`%scale: f32 = "K ** -0.5"`).
"""

from __future__ import annotations

import attrs

from . import constexpr
from .core import Block, Op, Value, define_op
from .types import MemSpace, SymDim, TensorType


def _defaults(items) -> tuple[tuple[str, object], ...]:
    return tuple((str(k), v) for k, v in items)


@define_op("kfc.func")
class FuncOp(Op):
    sym_name: str
    num_outputs: int
    defaults: tuple[tuple[str, object], ...] = attrs.field(default=(), converter=_defaults)

    @property
    def body(self) -> Block:
        return self.regions[0]

    @property
    def args(self) -> tuple[Value, ...]:
        return self.body.args

    @property
    def inputs(self) -> tuple[Value, ...]:
        return self.body.args[: len(self.body.args) - self.num_outputs]

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.body.args[len(self.body.args) - self.num_outputs:]

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    def arg(self, name: str) -> Value:
        for v in self.body.args:
            if v.name == name:
                return v
        raise KeyError(name)

    @property
    def tensor_inputs(self) -> list[Value]:
        return [v for v in self.inputs if v.ttype.space is not MemSpace.REG]

    @property
    def scalar_inputs(self) -> list[Value]:
        return [v for v in self.inputs if v.ttype.space is MemSpace.REG]

    @property
    def symbols(self) -> list[str]:
        """Shape symbols in order of first appearance in the signature."""
        seen: list[str] = []
        for v in self.body.args:
            for d in v.ttype.shape:
                if isinstance(d, SymDim) and d.name not in seen:
                    seen.append(d.name)
        return seen

    def default_of(self, name: str):
        return dict(self.defaults).get(name)

    def verify_(self) -> None:
        if len(self.regions) != 1:
            raise self.error("needs exactly one region")
        if self.results or self.operands:
            raise self.error("takes no operands and has no results")
        args = self.body.args
        if not 0 <= self.num_outputs <= len(args):
            raise self.error(f"num_outputs {self.num_outputs} does not fit {len(args)} arguments")
        names = [a.name for a in args]
        if any(not n for n in names):
            raise self.error("every argument needs a name")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise self.error(f"argument name {dup[0]!r} is used twice")
        for a in args:
            if not isinstance(a.type, TensorType):
                raise self.error(f"argument %{a.name} has non-tensor type {a.type}")
        for o in self.outputs:
            if o.ttype.space is not MemSpace.GLOBAL:
                raise self.error(f"output %{o.name} must be a tensor in global memory, not {o.type}")
        for v in self.inputs:
            t = v.ttype
            if t.space is MemSpace.REG and not t.is_scalar:
                raise self.error(f"input %{v.name} is a register tile; inputs are global tensors or scalars")
        scalars = {v.name for v in self.scalar_inputs}
        syms = set(self.symbols)
        for name, value in self.defaults:
            if name not in scalars:
                raise self.error(f"default given for {name!r}, which is not a scalar input")
            if isinstance(value, str):
                try:
                    unknown = constexpr.symbols_of(value) - syms
                except constexpr.ConstExprError as e:
                    raise self.error(str(e)) from None
                if unknown:
                    raise self.error(f"default of {name!r} uses unknown symbol(s) {sorted(unknown)}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.error(f"default of {name!r} must be a number or a constant expression")
