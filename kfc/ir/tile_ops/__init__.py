"""The `tile` dialect: hardware-agnostic tensor math over tiles, loads/stores of global tensors,
parallel loops and sequential loops with carried values.

Operands of elementwise ops have identical types (the builder inserts explicit broadcasts and
integer promotions); everything a later pass or the interpreter needs is in the types and the
attributes declared on each class.

By job: elementwise (constants, generators, unary/binary math, cmp, where, cast), shape
(broadcast, expand_dims, reshape, transpose), reductions (reduce, max_sumexp, scan), matmul
(dot, tri_inv), memory (IndexDim, load, store), control (parallel, for, if, yield); checks holds what
the verify_ methods share. The modules are imported in this order, which is the order their
ops register.
"""

from .elementwise import (
    BINARY_CLASSES, BINARY_OPS, COMMUTATIVE, KIND_WORDS, UNARY_CLASSES, UNARY_OPS, BinaryOp, BitcastOp, CastOp, CmpOp, CmpPred,
    ConstOp, DimOp, IotaOp, OperandKind, TriOp, UnaryOp, WhereOp, kind_accepts,
)
from .shape import BroadcastOp, ExpandDimsOp, ReshapeOp, TransposeOp, broadcast_compatible
from .reductions import MaxSumExpOp, ReduceKind, ReduceOp, ScanOp, reduced_shape
from .matmul import DotOp, TriInvOp
from .memory import IndexDim, LoadOp, ScratchOp, StoreOp, index_operands, indexed_shape
from .control import LOOP_REDUCE_KINDS, ForOp, IfOp, ParallelOp, YieldOp, verify_loop_reductions

__all__ = [
    "BINARY_CLASSES", "BINARY_OPS", "COMMUTATIVE", "KIND_WORDS", "UNARY_CLASSES", "UNARY_OPS", "BinaryOp", "BitcastOp", "CastOp",
    "CmpOp", "CmpPred", "ConstOp", "DimOp", "IotaOp", "OperandKind", "TriOp", "UnaryOp", "WhereOp", "kind_accepts",
    "BroadcastOp", "ExpandDimsOp", "ReshapeOp", "TransposeOp", "broadcast_compatible",
    "MaxSumExpOp", "ReduceKind", "ReduceOp", "ScanOp", "reduced_shape",
    "DotOp", "TriInvOp",
    "IndexDim", "LoadOp", "ScratchOp", "StoreOp", "index_operands", "indexed_shape",
    "LOOP_REDUCE_KINDS", "ForOp", "IfOp", "ParallelOp", "YieldOp", "verify_loop_reductions",
]
