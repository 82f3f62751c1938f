"""Checks the tile dialect's verify_ methods share, and the gpu, smem and mma dialects' too."""

from __future__ import annotations

from ..core import Op, Value
from ..types import Dim, MemSpace, TensorType


def tensor_of(op: Op, v: Value, what: str) -> TensorType:
    if not isinstance(v.type, TensorType):
        raise op.error(f"{what} must be a tensor or tile, not {v.type}")
    return v.type


def reg_tile_of(op: Op, v: Value, what: str) -> TensorType:
    t = tensor_of(op, v, what)
    if t.space is not MemSpace.REG:
        raise op.error(f"{what} must be a register tile, not {t}",
                       "load the tensor into a tile first, e.g. x[m, :]")
    return t


def check_int_scalar(op: Op, v: Value, what: str) -> None:
    t = tensor_of(op, v, what)
    if not (t.is_scalar and t.dtype.is_int):
        raise op.error(f"{what} must be an integer scalar, not {t}")


def same_shape(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> bool:
    return tuple(a) == tuple(b)


def shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_results(op: Op, n: int) -> None:
    if len(op.results) != n:
        raise op.error(f"expects {n} result(s), has {len(op.results)}")


def check_operands(op: Op, n: int) -> None:
    if len(op.operands) != n:
        raise op.error(f"expects {n} operand(s), has {len(op.operands)}")
