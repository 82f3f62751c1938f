"""The product accelerate-matmul rewrites, found in a program: one whole-tensor dot of two
loaded rank-2 operands, the elementwise ops after it (the epilogue: casts, scales, a bias along
the columns, activations), the scalar ops they use, and the store of the result; a PassError
saying what does not fit."""

from __future__ import annotations

import attrs

from ..ir.core import Op
from ..ir.func import FuncOp
from ..ir.mma_ops import TMA_GRANULE
from ..ir.tile_ops import BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, DotOp, LoadOp, StoreOp
from ..ir.tile_ops import UnaryOp, WhereOp
from .base import PassError

EPILOGUE_OPS = (UnaryOp, BinaryOp, CastOp, CmpOp, WhereOp, ConstOp, DimOp, BroadcastOp)


@attrs.frozen
class MatmulMatch:
    load_a: LoadOp
    load_b: LoadOp
    dot: DotOp
    store: StoreOp
    epilogue: tuple[Op, ...]   # in program order, between the dot and the store
    prelude: tuple[Op, ...]    # scalar ops the epilogue uses (constants, dims)
    columns: dict              # a loaded vector of the product's columns (a bias) -> its load


def _whole(op: LoadOp | StoreOp) -> bool:
    return all(ix.kind == "all" for ix in op.index)


_NOT_ELEMENTWISE = {"reduce": "a reduction", "scan": "a scan", "transpose": "a transpose", "reshape": "a reshape",
                    "expand_dims": "a new axis", "dot": "another product", "store": "a partial store",
                    "load": "a partial read", "max_sumexp": "a softmax reduction"}


def _shape(t) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def _described(op: Op, dot: DotOp, columns: dict) -> str:
    """What the program wrote for `op`, in its words (no IR names)."""
    rows, cols = dot.result.ttype.shape
    if isinstance(op, LoadOp):
        t = op.operands[0].ttype
        what = f"'{op.operands[0].name}' {_shape(t)}"
        if tuple(t.shape) == (rows, cols):
            return f"the residual {what} (a tensor the size of the product)"
        if t.rank == 1 and t.shape[0] == rows:
            return f"the row vector {what} (one value per row of the product, as in {op.operands[0].name}[:, None])"
        return f"the tensor {what} read as {_shape(op.result.ttype)}"
    if isinstance(op, CastOp) and op.operands[0] in columns:
        vec = columns[op.operands[0]].operands[0]
        return f"{op.result.ttype.dtype}({vec.name}), a cast of the vector '{vec.name}' {_shape(vec.ttype)}"
    return f"a {_shape(op.result.ttype)} value computed apart from the product"


def _advice(op: Op, columns: dict) -> str:
    if isinstance(op, CastOp) and op.operands[0] in columns:
        vec = columns[op.operands[0]].operands[0]
        return (f"declare '{vec.name}' as {op.result.ttype.dtype}[{vec.ttype.shape[0]}] and add it uncast, "
                f"e.g. dot(a, b) + {vec.name}")
    return ("add a residual or a per-row vector in a second op over the product's output; "
            "here only scalars and bias[N] vectors along the columns join the product")


def match_matmul(func: FuncOp) -> MatmulMatch:
    """The one whole-tensor dot of `func`, its operand loads, the elementwise ops after it and
    the store of their result; a PassError that says what does not fit."""
    ops = func.body.ops
    dots = [op for op in ops if isinstance(op, DotOp)]
    if len(dots) != 1:
        raise PassError(f"accelerate-matmul: takes a program with one dot, not {len(dots)}",
                        dots[1].loc if len(dots) > 1 else func.loc)
    dot = dots[0]
    defs = {r: op for op in ops for r in op.results}
    load_a, load_b = (defs.get(v) for v in dot.operands)
    for ld, what in ((load_a, "A"), (load_b, "B")):
        if not (isinstance(ld, LoadOp) and _whole(ld) and ld.operands[0].ttype.rank == 2):
            raise PassError(f"accelerate-matmul: the dot's {what} must be a whole rank-2 tensor, loaded as x[:, :]",
                            dot.loc, "write the product on whole tensors, c = dot(a, b), and a transposed "
                            "operand with the dot's own flags, dot(a, b, trans_b=true), not a.T or b.T")
    stores = [op for op in ops if isinstance(op, StoreOp)]
    if len(stores) != 1 or not _whole(stores[0]) or stores[0].operands[1].ttype.rank != 2:
        raise PassError("accelerate-matmul: the product must be stored whole into one rank-2 output, c[:, :] = ...",
                        dot.loc)
    store = stores[0]
    # the ops between the dot and the store that compute on the product: elementwise only
    on_product = {dot.result}
    epilogue, prelude = [], []
    n_cols = dot.result.ttype.shape[1]
    columns = {op.result: op for op in ops if isinstance(op, LoadOp) and _whole(op)
               and op.operands[0].ttype.rank == 1 and op.operands[0].ttype.shape[0] == n_cols}
    for op in ops:
        if op in (load_a, load_b, dot, store) or op in columns.values():
            continue
        reads_product = any(v in on_product for v in op.operands)
        # a constant or a scalar spread over the product's shape (max(d * scale, 0.0)) becomes a tile too
        spreads_scalar = isinstance(op, (BroadcastOp, ConstOp)) and \
            all(v.ttype.is_scalar or v in columns for v in op.operands) \
            and tuple(op.result.ttype.shape) == tuple(dot.result.ttype.shape)
        if reads_product or spreads_scalar:
            if not isinstance(op, EPILOGUE_OPS):
                raise PassError(f"the matrix-product kernel takes elementwise math after dot(...), not "
                                f"{_NOT_ELEMENTWISE.get(op.NAME.rpartition('.')[2], 'this operation')} of the product",
                                op.loc, "store the product, c = dot(a, b) (with elementwise math), and "
                                "reduce or reshape it in a second op")
            for v in op.operands:
                t = v.ttype
                if v not in on_product and not t.is_scalar and v not in columns:
                    raise PassError(f"the matrix-product kernel cannot combine the product with a {_shape(t)} "
                                    f"{t.dtype} value: beside it, its epilogue takes scalars and whole vectors of "
                                    "length N (the product's columns) added as they are declared", op.loc,
                                    "combine the two in a second op over the product's output")
            on_product.update(op.results)
            epilogue.append(op)
        elif isinstance(op, (ConstOp, DimOp)) or all(r.ttype.is_scalar for r in op.results) and \
                isinstance(op, EPILOGUE_OPS):
            prelude.append(op)
        else:
            raise PassError(f"the matrix-product kernel cannot take {_described(op, dot, columns)} beside "
                            "dot(...): its epilogue takes math on the product and scalars, and whole vectors of "
                            "length N (the product's columns) added as they are declared",
                            op.loc, _advice(op, columns))
    if store.operands[0] not in on_product:
        raise PassError("accelerate-matmul: the stored value does not come from the dot", store.loc)
    for v, ld in columns.items():
        if any(v in op.operands and not isinstance(op, BroadcastOp) for op in ops):
            raise PassError(f"accelerate-matmul: {ld.operands[0].name} is used other than spread over the product's "
                            "rows", ld.loc)
    return MatmulMatch(load_a, load_b, dot, store, tuple(epilogue), tuple(prelude), columns)


def tma_movable(m: MatmulMatch) -> bool:
    """Whether TMA can copy both operands' tiles: a[M, K] and b[K, N] as written (not
    transposed), each row pitch a multiple of 16 bytes (accelerate-matmul's copy=auto)."""
    ta, tb = (ld.operands[0].ttype for ld in (m.load_a, m.load_b))
    return not (m.dot.trans_a or m.dot.trans_b) and \
        all(t.is_static and t.shape[1] * t.dtype.itemsize % TMA_GRANULE == 0 for t in (ta, tb))


def tma_product_rows(func: FuncOp) -> int | None:
    """M, the rows of `func`'s one matrix product where TMA moves its operands (tma_movable),
    else None."""
    try:
        m = match_matmul(func)
    except PassError:
        return None
    return m.load_a.operands[0].ttype.shape[0] if tma_movable(m) else None
