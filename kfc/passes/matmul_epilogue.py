"""What accelerate-matmul builds after the main loop: the .kfc's epilogue on the accumulator's
tile (with tanh.approx where the outputs allow it) and, with store=tma, the tile's way to global
memory through staging slots in shared memory and TMA stores (kfc.ir.mma_ops.tma_store).
`m` is the product accelerate-matmul matched (kfc.passes.matmul_match.MatmulMatch)."""

from __future__ import annotations

import attrs

from ..ir import layouts
from ..ir.builder import Builder
from ..ir.core import Op, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.mma_ops import (CHUNK_BYTES, STORE_ROWS, FenceProxyAsyncOp, LoadColumnsOp, StageFragmentOp, StagesAllocOp,
                          TensorMapOp, TmaStoreOp, TmaStoreWaitOp)
from ..ir.ptx_ops import TanhApproxOp
from ..ir.tile_ops import UNARY_CLASSES, BroadcastOp
from ..ir.types import MemSpace, TensorType
from .lower_ptx import ctx_tolerance

# staging slots of a TMA-store epilogue: the threads write one while the other's store reads it
STORE_SLOTS = 2
TANH_APPROX_MIN_TOLERANCE = 1e-3  # the loosest outputs tanh.approx's 2^-11 leaves ten times the room


def epilogue(b: Builder, m, acc: Value, acc_t: TensorType, col0: Value,
             approx_tanh: bool = False) -> Value:
    """The .kfc's ops after the dot, on the accumulator's tile: same ops, the tile's shape and
    layout in place of the whole product's; a vector spread over the rows (a bias) is read
    for the tile's columns; with approx_tanh an f32 tanh is tanh.approx."""
    mapping: dict[Value, Value] = {m.dot.result: acc}
    for op in m.epilogue:
        if isinstance(op, BroadcastOp) and op.operands[0] in m.columns:
            vec = m.columns[op.operands[0]].operands[0]
            t = attrs.evolve(op.result.ttype, shape=acc_t.shape, layout=acc_t.layout)
            with b.at(op.loc):
                mapping[op.result] = b.create(LoadColumnsOp, [vec, col0], [t], name=op.result.name).result
            continue
        results = []
        for r in op.results:
            t = r.ttype
            results.append(Value(attrs.evolve(t, shape=acc_t.shape, layout=acc_t.layout) if not t.is_scalar
                                 else t, r.name))
        operands = tuple(mapping.get(v, v) for v in op.operands)
        if approx_tanh and isinstance(op, UNARY_CLASSES["tanh"]) and op.result.ttype.dtype is DType.F32:
            b.insert(TanhApproxOp(operands=operands, results=tuple(results), loc=op.loc))
        else:
            b.insert(op.evolve(operands=operands, results=tuple(results)))
        mapping.update(zip(op.results, results))
    return mapping[m.store.operands[0]]


def tanh_approximated(approx: str, m, ctx, func: FuncOp) -> list[Op]:
    """The epilogue's f32 tanh that become tanh.approx (none unless the options and the
    outputs allow it)."""
    tanhs = [op for op in m.epilogue if isinstance(op, UNARY_CLASSES["tanh"]) and op.result.ttype.dtype is DType.F32]
    if not tanhs or approx == "off":
        return []
    floats = [v for v in func.outputs if v.ttype.dtype.is_float]
    if approx == "auto" and not (all(v.ttype.dtype.itemsize <= 2 for v in floats)
                                      and ctx_tolerance(ctx, func) >= TANH_APPROX_MIN_TOLERANCE):
        return []
    return tanhs


def tma_store(b: Builder, C: Value, bm: int, bn: int, consumers: int = 1, pieces: int = 1):
    """C's tensor map and the staging slots, STORE_SLOTS for each consumer role; and
    `store(value, row0, col0, n, consumer)`, which writes the tile's value at (row0, col0) 128
    bytes of columns at a time into the consumer's slots in turn (chunk j of its tile n into
    its slot (n * chunks + j) % 2, once the store that last read it has), and stores each chunk
    by TMA, `pieces` boxes of 64 rows a warpgroup."""
    dt = C.ttype.dtype
    width = CHUNK_BYTES // dt.itemsize
    chunks = bn // width
    box = (STORE_ROWS, width)
    tm = b.create(TensorMapOp, [C], [attrs.evolve(C.ttype, layout=layouts.TensorMapBox(
        *box, CHUNK_BYTES).as_layout())], box=box, swizzle=CHUNK_BYTES, name=f"tm_{C.name}").result
    staging = b.create(StagesAllocOp, [], [TensorType(dt, (STORE_SLOTS * consumers, 1, bm, width), MemSpace.SHARED,
                                                      layouts.SharedTile(CHUNK_BYTES).as_layout())],
                       name=f"s{C.name}").result


    def store(value: Value, row0: Value, col0: Value, n: Value | None, consumer: int = 0) -> None:
        first = consumer * STORE_SLOTS
        for j in range(chunks):
            if n is None or chunks % STORE_SLOTS == 0:
                slot = b.as_index(first + j % STORE_SLOTS)
            else:
                slot = b.binary("rem", b.binary("add", b.binary("mul", n, b.as_index(chunks)), b.as_index(j)), b.as_index(STORE_SLOTS),
                                name="slot")
                if first:
                    slot = b.binary("add", slot, b.as_index(first), name="slot")
            b.create(TmaStoreWaitOp, [], [], pending=STORE_SLOTS - 1)
            b.create(StageFragmentOp, [value, staging, slot], [], column=j * width)
            b.create(FenceProxyAsyncOp, [], [])
            b.create(TmaStoreOp, [tm, staging, slot, row0, b.binary("add", col0, b.as_index(j * width))], [],
                     pieces=pieces)

    return store
