"""Emission rules for ptx.ld and ptx.st: a row moves in vectors of up to 16 bytes a thread,
predicated on its row being one of the CTA's and on each chunk lying inside the row; a scalar
access is guarded by every index lying inside its tensor (an index read from memory can be
anything).
"""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.ptx_ops import LdOp, StOp
from ..ir.types import MemSpace
from . import ptx
from .c_names import BITS_TO, TO_BITS, literal
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
        conds = em.scalar_access_conds(op, tensor, op.index, op.operands[1:], guard)
        em.emit(f"{n} = {other};")
        em.emit(f"if ({' && '.join(conds)}) {n} = {em.name(tensor)}[{addr}];")
        return
    shared = t.space is MemSpace.SHARED
    word, nwords, per_word, accesses, pred = em.access_plan(op, d, guard)
    em.open_chunks()
    base = em.row.chunk_start_c("e", "kfc_g")
    for a in range(accesses):
        words = [em.fresh("w") for _ in range(nwords)]
        wt = "unsigned" if word == 4 else "unsigned short"
        fill = _other_bits(em, op.other, d, word)
        em.emit(f"{wt} {', '.join(f'{w} = {fill}' for w in words)};")
        if shared:  # this CTA's part of a staged row: its spans one after another
            offset = f"({em.row.cta_offset_c('e', 'kfc_t')} + {a * op.vec})"
            em.emit(ptx.ld_shared(words, f"{em.name(tensor)} + (unsigned)({offset}) * {d.itemsize}u", pred,
                                    word))
        else:
            at = f"{base} + {a * op.vec}"
            addr = f"{em.name(tensor)} + {em._address(op, tensor, op.index, op.operands[1:], at)}"
            em.emit(ptx.ld_global(words, addr, em.with_slice(pred, tensor, op.index, op.operands[1:], at),
                                    op.cache, word))
        for wi, w in enumerate(words):
            for k in range(per_word):
                em.emit(f"{em.chunk_elem(r, a * op.vec + wi * per_word + k)} = {_from_bits(em, w, d, k, word)};")
    em.close_chunks()


def _other_bits(em, value, d: DType, word: int) -> str:
    import numpy as np

    raw = np.asarray(value).astype(d.np).tobytes()
    per = word // len(raw) if len(raw) < word else 1
    bits = int.from_bytes(raw * per, "little")
    return f"{bits}u"


def _from_bits(em, w: str, d: DType, k: int, word: int) -> str:
    if d in (DType.BF16, DType.F16):
        part = f"(unsigned short)(({w} >> {16 * k}) & 0xffffu)" if word == 4 else w
        return f"{BITS_TO[d]}({part})"
    if d is DType.F32:
        return f"__uint_as_float({w})"
    if d is DType.I32:
        return f"(int)({w})"
    raise CodegenError(f"row loads of {d} are not supported yet")


def _to_bits(em, x: str, d: DType) -> str:
    if d in (DType.BF16, DType.F16):
        return f"(unsigned){TO_BITS[d]}({x})"
    if d is DType.F32:
        return f"__float_as_uint({x})"
    if d is DType.I32:
        return f"(unsigned)({x})"
    raise CodegenError(f"row stores of {d} are not supported yet")


@rule(StOp)
def emit_st(em, op: StOp) -> None:
    value, tensor = op.operands[0], op.operands[1]
    t = tensor.ttype
    d = t.dtype
    guard = f"{em.name(tensor)} != nullptr" if t.optional else None
    if em.kind(value) != "row":
        addr = em._address(op, tensor, op.index, op.operands[2:], "0")
        cond = ["kfc_t == 0", "kfc_crank == 0"] + em.scalar_access_conds(op, tensor, op.index, op.operands[2:],
                                                                           guard)
        em.emit(f"if ({' && '.join(cond)}) {em.name(tensor)}[{addr}] = {em.name(value)};")
        return
    word, nwords, per_word, accesses, pred = em.access_plan(op, d, guard)
    em.open_chunks()
    base = em.row.chunk_start_c("e", "kfc_g")
    for a in range(accesses):
        words = []
        for wi in range(nwords):
            parts = []
            for k in range(per_word):
                bits = _to_bits(em, em.chunk_elem(value, a * op.vec + wi * per_word + k), d)
                parts.append(f"({bits} << {16 * k})" if per_word > 1 else bits)
            w = em.fresh("s")
            wt = "unsigned" if word == 4 else "unsigned short"
            em.emit(f"const {wt} {w} = ({wt})({' | '.join(parts)});")
            words.append(w)
        at = f"{base} + {a * op.vec}"
        addr = f"{em.name(tensor)} + {em._address(op, tensor, op.index, op.operands[2:], at)}"
        em.emit(ptx.st_global(words, addr, em.with_slice(pred, tensor, op.index, op.operands[2:], at),
                                op.cache, word))
    em.close_chunks()
