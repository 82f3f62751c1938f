"""The tile dialect's memory ops: how a load or store indexes a tensor (IndexDim), tile.load
and tile.store."""

from __future__ import annotations

import attrs
import numpy as np

from ..core import Op, define_op
from ..types import Dim, MemSpace, TensorType, bare_type
from .checks import check_int_scalar, reg_tile_of, tensor_of


@attrs.frozen
class IndexDim:
    """How one dimension of a tensor is indexed by a load or store.

    point: one index operand, the dim is dropped (`x[m, ...]`)
    all:   the whole dim, no operand (`x[:, ...]`)
    slice: `size` elements from a start operand (`x[t:t+64]`); with `limit`, a second operand
           bounds the valid indices (`x[t:t+64 limit eos]`). Elements at or past the limit or
           the tensor's extent read as the load's `other` and are not stored.
    """

    kind: str
    size: int = 0
    limit: bool = False

    def to_attr(self) -> str:
        if self.kind == "point":
            return "i"
        if self.kind == "all":
            return ":"
        return f"+{self.size}" + ("<" if self.limit else "")

    @classmethod
    def parse(cls, text) -> "IndexDim":
        if isinstance(text, IndexDim):
            return text
        if text == "i":
            return cls("point")
        if text == ":":
            return cls("all")
        if isinstance(text, str) and text.startswith("+"):
            limit = text.endswith("<")
            body = text[1:-1] if limit else text[1:]
            if body.isdigit() and int(body) > 0:
                return cls("slice", int(body), limit)
        raise ValueError(f"bad index entry {text!r}: expected \"i\", \":\", \"+N\" or \"+N<\"")

    @property
    def n_operands(self) -> int:
        return {"point": 1, "all": 0}.get(self.kind, 2 if self.limit else 1)


def index_operands(op) -> list[tuple[IndexDim, list]]:
    """Each index of a load or store with its operands: a point's index, a slice's start (then
    its limit), none for a whole dim."""
    it = iter(op.operands[1:] if op.NAME == "tile.load" else op.operands[2:])
    return [(ix, [next(it) for _ in range(ix.n_operands)]) for ix in op.index]


def index_tuple(items) -> tuple[IndexDim, ...]:
    return tuple(IndexDim.parse(x) for x in items)


def indexed_shape(t: TensorType, index: tuple[IndexDim, ...]) -> list[Dim]:
    shape = []
    for d, ix in zip(t.shape, index):
        if ix.kind == "all":
            shape.append(d)
        elif ix.kind == "slice":
            shape.append(ix.size)
    return shape


def verify_index(op: Op, tensor: TensorType, index: tuple[IndexDim, ...], idx_operands) -> None:
    if tensor.space is MemSpace.REG:
        raise op.error(f"indexes a register tile {tensor}; loads and stores address memory")
    if len(index) != tensor.rank:
        raise op.error(f"{len(index)} index entries for a rank-{tensor.rank} tensor")
    need = sum(ix.n_operands for ix in index)
    if len(idx_operands) != need:
        raise op.error(f"index needs {need} operand(s), has {len(idx_operands)}")
    for v in idx_operands:
        check_int_scalar(op, v, "index")


@define_op("tile.load", traits={"reads_memory"}, results=1)
class LoadOp(Op):
    """Read a tile from a tensor: operands are the tensor, then the index operands in order.
    Reading an absent optional tensor gives a tile filled with `other`."""

    index: tuple[IndexDim, ...] = attrs.field(converter=index_tuple)
    other: bool | int | float = 0

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        return [TensorType(t.dtype, tuple(indexed_shape(t, index_tuple(attributes["index"]))))]

    def verify_(self) -> None:
        if not self.operands:
            raise self.error("needs a tensor operand")
        t = tensor_of(self, self.operands[0], "tensor")
        verify_index(self, t, self.index, self.operands[1:])
        if not isinstance(self.other, (bool, int, float)):
            raise self.error(f"other (what reads past the tensor give) must be a number, not {self.other!r}")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([t], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} must be "
                             f"{self.infer_result_types([t], self.attributes())[0]}")

    def interpret(self, interp, ins, env):
        arr = ins[0]
        rt = self.result.ttype
        out_shape = interp.shape_of(rt)
        if arr is None:  # an absent optional tensor reads as `other`
            return [np.full(out_shape, self.other, dtype=rt.dtype.np)]
        arr = interp.readable(self, arr)
        return [interp.gather(self, self.operands[0].ttype, self.index, ins[1:], arr, self.other, out_shape, rt.dtype.np)]


@define_op("tile.store", traits={"writes_memory"}, results=0)
class StoreOp(Op):
    """Write a tile into a tensor: operands are the value, the tensor, then index operands."""

    index: tuple[IndexDim, ...] = attrs.field(converter=index_tuple)

    def verify_(self) -> None:
        if len(self.operands) < 2:
            raise self.error("needs a value and a tensor operand")
        v = reg_tile_of(self, self.operands[0], "stored value")
        t = tensor_of(self, self.operands[1], "tensor")
        verify_index(self, t, self.index, self.operands[2:])
        want = TensorType(t.dtype, tuple(indexed_shape(t, self.index)))
        if bare_type(v) != want:
            raise self.error(f"stores {v} where the indexed region is {want}")

    def interpret(self, interp, ins, env):
        value, arr = ins[0], ins[1]
        if arr is None:  # an absent optional output is not written
            return None
        t = self.operands[1].ttype
        plan = interp.gather_plan(self, t, self.index, ins[2:], arr.shape)
        dst = [pos[valid] for _, pos, valid in plan]
        if any(len(d) == 0 for d in dst):
            return None
        # positions inside the value tile: point dims are absent from it
        src = [np.nonzero(valid)[0] for kind, _, valid in plan if kind != "point"]
        v = np.asarray(value)
        block = v[np.ix_(*src)] if src else v
        target_shape = tuple(len(d) for d in dst)
        arr[np.ix_(*dst)] = np.reshape(block, target_shape)
        interp.record_write(self, dst)
        return None


@define_op("tile.scratch", operands=0, results=1)
class ScratchOp(Op):
    """A tensor in global memory that lives for one call of the op: written by one parallel loop
    and read by a later one (the runtime allocates it per call, the kernels take it as a
    workspace). Not pure: two scratch tensors of one type are two tensors. Its elements read as
    NaN (floats) or the dtype's largest value (integers) until stored, as a poisoned output does."""

    def verify_(self) -> None:
        t = tensor_of(self, self.result, "result")
        if t.space is not MemSpace.GLOBAL or t.rank == 0:
            raise self.error(f"a scratch tensor is a tensor in global memory, not {t}")

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        np_type = t.dtype.np
        poison = np.nan if t.dtype.is_float else True if t.dtype.is_bool else np.iinfo(np_type).max
        return [np.full(interp.shape_of(t), poison, dtype=np_type)]
