"""Emission rules for ptx.ld and ptx.st: a row moves in vectors of up to 16 bytes a thread,
predicated on its row being one of the CTA's and on each chunk lying inside the row; a scalar
access is guarded by every index lying inside its tensor (an index read from memory can be
anything).
"""

from __future__ import annotations

import numpy as np

from ..ir.core import Value
from ..ir.dtypes import DType, convert
from ..ir.ptx_ops import LdOp, StOp
from ..ir.tile_ops import IndexDim
from ..ir.types import MemSpace
from . import ptx
from .c_names import BITS_TO, C_TYPES, TO_BITS, literal
from .errors import CodegenError
from .rules import rule


@rule(LdOp)
def emit_ld(em, op: LdOp) -> None:
    tensor = op.operands[0]
    t = tensor.ttype
    r = op.result
    d = t.dtype
    n = em.declare(r)
    other = literal(op.other, d)
    guard = f"{em.name(tensor)} != nullptr" if t.optional else None
    if em.kind(r) != "row":
        addr = em._address(op, tensor, op.index, op.operands[1:], "0")
        conds = scalar_access_conds(em, op, tensor, op.index, op.operands[1:], guard)
        em.emit(f"{n} = {other};")
        em.emit(f"if ({' && '.join(conds)}) {n} = {em.name(tensor)}[{addr}];")
        return
    shared = t.space is MemSpace.SHARED
    word, nwords, per_word, accesses, pred = access_plan(em, op, d, guard)
    em.open_chunks()
    base = em.row.chunk_start_c("e", "kfc_g")
    for a in range(accesses):
        words = [em.fresh("w") for _ in range(nwords)]
        wt = WORD_C[word]
        fill = _other_bits(op.other, d, word)
        em.emit(f"{wt} {', '.join(f'{w} = {fill}' for w in words)};")
        if shared:  # this CTA's part of a staged row: its spans one after another
            offset = f"({em.row.cta_offset_c('e', 'kfc_t')} + {a * op.vec})"
            em.emit(ptx.ld_shared(words, f"{em.name(tensor)} + (unsigned)({offset}) * {d.itemsize}u", pred,
                                    word))
        else:
            at = f"{base} + {a * op.vec}"
            addr = f"{em.name(tensor)} + {em._address(op, tensor, op.index, op.operands[1:], at)}"
            em.emit(ptx.ld_global(words, addr, with_slice(em, pred, tensor, op.index, op.operands[1:], at),
                                    op.cache, word))
        for wi, w in enumerate(words):
            for k in range(per_word):
                em.emit(f"{em.chunk_elem(r, a * op.vec + wi * per_word + k)} = {_from_bits(w, d, k, word, op.loc)};")
    em.close_chunks()


def _other_bits(value, d: DType, word: int) -> str:
    raw = convert(value, d).tobytes()
    per = word // len(raw) if len(raw) < word else 1
    bits = int.from_bytes(raw * per, "little")
    return f"{bits}u"


def _from_bits(w: str, d: DType, k: int, word: int, loc) -> str:
    """Element k of a loaded word (of `word` bytes) as a value of d."""
    bits = 8 * d.itemsize
    part = f"(({w} >> {bits * k}) & {hex((1 << bits) - 1)}u)" if word > d.itemsize else w
    if d in (DType.BF16, DType.F16):
        return f"{BITS_TO[d]}({'(unsigned short)' if word > d.itemsize else ''}{part})"
    if d is DType.F32:
        return f"__uint_as_float({w})"
    if d is DType.I32:
        return f"(int)({w})"
    if d.itemsize == 1:  # fp8 as its bits, i8 and u8 as themselves
        return f"({C_TYPES[d]})({part})"
    raise CodegenError(f"row loads of {d} are not supported yet", loc,
                       "load it one element at a time, or in a dtype of at most 4 bytes")


def _to_bits(x: str, d: DType, loc) -> str:
    """A value of d as the low bits of an unsigned word."""
    if d in (DType.BF16, DType.F16):
        return f"(unsigned){TO_BITS[d]}({x})"
    if d is DType.F32:
        return f"__float_as_uint({x})"
    if d is DType.I32:
        return f"(unsigned)({x})"
    if d.itemsize == 1:
        return f"(unsigned)(unsigned char)({x})"
    raise CodegenError(f"row stores of {d} are not supported yet", loc,
                       "store it one element at a time, or in a dtype of at most 4 bytes")


@rule(StOp)
def emit_st(em, op: StOp) -> None:
    value, tensor = op.operands[0], op.operands[1]
    t = tensor.ttype
    d = t.dtype
    guard = f"{em.name(tensor)} != nullptr" if t.optional else None
    if em.kind(value) != "row":
        addr = em._address(op, tensor, op.index, op.operands[2:], "0")
        cond = ["kfc_t == 0", "kfc_crank == 0"] + scalar_access_conds(em, op, tensor, op.index, op.operands[2:],
                                                                           guard)
        em.emit(f"if ({' && '.join(cond)}) {em.name(tensor)}[{addr}] = {em.name(value)};")
        return
    word, nwords, per_word, accesses, pred = access_plan(em, op, d, guard)
    em.open_chunks()
    base = em.row.chunk_start_c("e", "kfc_g")
    for a in range(accesses):
        words = []
        for wi in range(nwords):
            parts = []
            for k in range(per_word):
                bits = _to_bits(em.chunk_elem(value, a * op.vec + wi * per_word + k), d, op.loc)
                parts.append(f"({bits} << {8 * d.itemsize * k})" if per_word > 1 else bits)
            w = em.fresh("s")
            wt = WORD_C[word]
            em.emit(f"const {wt} {w} = ({wt})({' | '.join(parts)});")
            words.append(w)
        at = f"{base} + {a * op.vec}"
        addr = f"{em.name(tensor)} + {em._address(op, tensor, op.index, op.operands[2:], at)}"
        em.emit(ptx.st_global(words, addr, with_slice(em, pred, tensor, op.index, op.operands[2:], at),
                                op.cache, word))
    em.close_chunks()


def slice_conds(em, tensor: Value, index: tuple[IndexDim, ...], idx_operands, elem_offset: str) -> list[str]:
    """What must hold for the element at `elem_offset` of a sliced access (x[m, k:k+64],
    with or without a limit) to lie inside the tensor and below the limit: the tile has its
    own length, the tensor may end inside it."""
    it = iter(idx_operands)
    conds = []
    for ix, d in zip(index, tensor.ttype.shape):
        if ix.kind == "point":
            next(it)
        elif ix.kind == "slice":
            at = f"(long long)({em.name(next(it))}) + ({elem_offset})"
            # unsigned: a start read from memory may be negative, and must not reach below the tensor
            conds.append(f"(unsigned long long)({at}) < (unsigned long long)({em._dim(d)})")
            if ix.limit:
                conds.append(f"{at} < (long long)({em.name(next(it))})")
    return conds


def _chunk_pred(em, e: str) -> str | None:
    """Whether chunk e of this thread lies inside the row (None when it always does)."""
    if em.exact:
        return None
    return em.row.in_row_c(e, "kfc_g", em.N)


def with_slice(em, pred: str | None, tensor: Value, index, idx_operands, at: str) -> str | None:
    """An access's predicate with its slices' bounds at element `at` (a vector of the
    tile pass's width never straddles them: the tensor's dim and the slice's start are
    multiples of it)."""
    conds = ([pred] if pred else []) + slice_conds(em, tensor, index, idx_operands, at)
    return " && ".join(conds) if conds else None


def scalar_access_conds(em, op, tensor: Value, index: tuple[IndexDim, ...], idx_operands,
                        guard: str | None) -> list[str]:
    """What must hold for one element's load or store to stay inside its tensor: the row is
    one of the op's (the last CTA may hold fewer rows than it has slots), the optional
    tensor is present, and every point index lies in its dim (an index read from memory,
    such as a label, can be anything)."""
    conds = ["kfc_rowvalid"] if em.row_dependent(op) else []
    if guard:
        conds.append(f"({guard})")
    it = iter(idx_operands)
    for ix, d in zip(index, tensor.ttype.shape):
        if ix.kind == "point":
            conds.append(f"(unsigned long long)({em.name(next(it))}) < (unsigned long long)({em._dim(d)})")
    return conds or ["true"]


# the C type a word travels in: a byte in a 16-bit register (PTX has no 8-bit registers)
WORD_C = {4: "unsigned", 2: "unsigned short", 1: "unsigned short"}


def access_plan(em, op, d: DType, guard: str | None):
    """How a chunk of `vec` elements moves: 32-bit words (16-bit for 2-byte accesses, one byte
    for a single 1-byte element), words per access, elements per word, accesses per chunk, and
    the predicate of chunk e."""
    acc_bytes = op.vec * d.itemsize
    word = 4 if acc_bytes >= 4 else acc_bytes
    nwords = max(1, acc_bytes // word)
    per_word = word // d.itemsize if d.itemsize < word else 1
    conds = ["kfc_rowvalid"] if em.row_dependent(op) else []
    if (p := _chunk_pred(em, "e")) is not None:
        conds.append(p)
    if guard:
        conds.append(f"({guard})")
    return word, nwords, per_word, em.V // op.vec, " && ".join(conds) if conds else None
