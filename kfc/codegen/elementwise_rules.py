"""Emission rules for elementwise ops: constants, iota, dims, unary and binary arithmetic,
comparisons, where, casts (with ptx.cvt_pack's paired conversion) and broadcasts. A row value's
rule is a loop over the thread's registers; a scalar's, one expression.
"""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.multiples import power_of_two
from ..ir.ptx_ops import CvtPackOp, Ex2ApproxOp, RcpApproxOp, RsqrtApproxOp, TanhApproxOp
from ..ir.tile_ops import BinaryOp, BitcastOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, IotaOp, UnaryOp, WhereOp
from . import ptx
from .c_names import BITS_TO, C_TYPES, F32_TO_FP8, TO_BITS, c_dim, literal, to_int
from .errors import CodegenError
from .rules import rule


@rule(ConstOp)
def emit_const(em, op: ConstOp) -> None:
    t = op.result.ttype
    lit = literal(op.value, t.dtype)
    if t.dtype.is_int:
        em.int_constants[op.result] = int(op.value)
    if em.kind(op.result) == "row" and getattr(em, "inline", None) is not None:
        # a fragment tile of one value: written where it is read, no registers of its own (a
        # zero array cse shares between the accumulator's start and a max(.., 0) epilogue
        # would otherwise live through the whole main loop)
        em.inline[op.result] = lambda i: lit
    elif em.kind(op.result) == "row":
        n = em.declare(op.result)
        em.loop(f"{n}[i] = {lit};")
    else:
        em.emit(f"const {C_TYPES[t.dtype]} {em.name(op.result)} = {lit};")


@rule(IotaOp)
def emit_iota(em, op: IotaOp) -> None:
    """Each element its own row index (a register's, from the layout; in a chunk loop,
    chunk e's)."""
    if em.kind(op.result) != "row":
        raise CodegenError(f"iota makes a row here, not {op.result.type}", op.loc)
    ct = C_TYPES[op.result.ttype.dtype]
    n = em.declare(op.result)
    if em.chunk_local is not None:
        em.loop(f"{n}[i] = ({ct})({em.row.chunk_start_c('e', 'kfc_g')} + i);")
    else:
        em.loop(f"{n}[i] = ({ct})({em.row.register_element_c('i', 'kfc_g')});")


@rule(DimOp)
def emit_dim(em, op: DimOp) -> None:
    em.emit(f"const long long {em.name(op.result)} = {c_dim(op.sym)};")


@rule(UnaryOp)
def emit_unary(em, op: UnaryOp) -> None:
    fn = op.NAME.split(".")[1]
    d = op.operands[0].ttype.dtype
    x = op.operands[0]

    def expr(i):
        a = em.operand(x, i)
        if d.is_float:
            f = em.as_float(a, d)
            if isinstance(op, RsqrtApproxOp):
                return ptx.rsqrt_approx(f)
            if isinstance(op, Ex2ApproxOp):
                return ptx.ex2_approx(f)
            if isinstance(op, TanhApproxOp):
                return ptx.tanh_approx(f)
            if isinstance(op, RcpApproxOp):
                return ptx.rcp_approx(f)
            e = {
                "neg": f"(-{f})", "abs": f"fabsf({f})", "exp": f"expf({f})", "exp2": f"exp2f({f})",
                "log": f"logf({f})", "log2": f"log2f({f})", "sqrt": f"sqrtf({f})",
                "rsqrt": f"(1.0f / sqrtf({f}))", "sigmoid": f"(1.0f / (1.0f + expf(-{f})))",
                "softplus": f"({f} > 20.0f ? {f} : log1pf(expf({f})))", "tanh": f"tanhf({f})",
                "round": f"rintf({f})",
            }[fn]
            if d is DType.F64:
                e = e.replace("f(", "(").replace("1.0f", "1.0").replace("20.0f", "20.0")
            return em.from_float(e, d)
        e = {"neg": f"(-{a})", "abs": f"({a} < 0 ? -{a} : {a})",
             "not": f"(!{a})" if d.is_bool else f"(~{a})"}[fn]
        return e

    em.assign(op, expr)


@rule(BinaryOp)
def emit_binary(em, op: BinaryOp) -> None:
    fn = op.NAME.split(".")[1]
    d = op.operands[0].ttype.dtype
    a_v, b_v = op.operands

    def expr(i):
        a, b = em.operand(a_v, i), em.operand(b_v, i)
        if d.is_float:
            fa, fb = em.as_float(a, d), em.as_float(b, d)
            if d is DType.F64:
                e = {"add": f"({fa} + {fb})", "sub": f"({fa} - {fb})", "mul": f"({fa} * {fb})",
                     "div": f"({fa} / {fb})", "max": f"fmax({fa}, {fb})", "min": f"fmin({fa}, {fb})",
                     "pow": f"pow({fa}, {fb})", "rem": f"({fa} - floor({fa} / {fb}) * {fb})"}[fn]
                return e
            e = {"add": f"({fa} + {fb})", "sub": f"({fa} - {fb})", "mul": f"({fa} * {fb})",
                 "div": f"({fa} / {fb})", "max": ptx.max_nan(fa, fb), "min": ptx.min_nan(fa, fb),
                 "pow": f"powf({fa}, {fb})", "rem": f"({fa} - floorf({fa} / {fb}) * {fb})"}[fn]
            return em.from_float(e, d)
        if fn in ("div", "rem") and (k := power_of_two(em.int_constants.get(b_v))) is not None:
            # a floor division by 2^k is an arithmetic shift, its remainder the low k bits
            return f"({a} >> {k})" if fn == "div" else f"({a} & {(1 << k) - 1}{'LL' if k > 30 else ''})"
        if d.is_bool:
            return {"and": f"({a} && {b})", "or": f"({a} || {b})", "xor": f"({a} != {b})",
                    "max": f"({a} || {b})", "min": f"({a} && {b})"}[fn]
        return {"add": f"({a} + {b})", "sub": f"({a} - {b})", "mul": f"({a} * {b})",
                "div": f"kfc_floordiv({a}, {b})", "rem": f"kfc_floormod({a}, {b})",
                "max": f"({a} > {b} ? {a} : {b})", "min": f"({a} < {b} ? {a} : {b})",
                "and": f"({a} & {b})", "or": f"({a} | {b})", "xor": f"({a} ^ {b})"}[fn]

    em.assign(op, expr)


@rule(CmpOp)
def emit_cmp(em, op: CmpOp) -> None:
    sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op.pred.value]
    d = op.operands[0].ttype.dtype

    def expr(i):
        a, b = (em.as_float(em.operand(v, i), d) for v in op.operands)
        return f"({a} {sym} {b})"

    em.assign(op, expr)


@rule(WhereOp)
def emit_where(em, op: WhereOp) -> None:
    c, a, b = op.operands
    em.assign(op, lambda i: f"({em.operand(c, i)} ? {em.operand(a, i)} : {em.operand(b, i)})")


@rule(CastOp)
def emit_cast(em, op: CastOp) -> None:
    src, dst = op.operands[0].ttype.dtype, op.result.ttype.dtype
    x = op.operands[0]

    if src is DType.F64 and dst in F32_TO_FP8:
        raise CodegenError(f"a cast from f64 to {dst} would round twice on the GPU (through f32)", op.loc,
                           f"cast through f32 on purpose: {dst}(f32(x))")

    def expr(i):
        a = em.operand(x, i)
        if src.is_float and dst.is_float:
            return em.from_float(em.as_float(a, src), dst) if DType.F64 not in (src, dst) else \
                f"({C_TYPES[dst]})({em.as_float(a, src)})"
        if src.is_float:
            return to_int(em.as_float(a, src), dst)
        if dst.is_float:
            return em.from_float(f"(float)({a})", dst)
        return f"({C_TYPES[dst]})({a})"

    em.assign(op, expr)


def _bits_of(expr: str, d: DType) -> str:
    """A value's bits as an unsigned integer of its width."""
    if d in TO_BITS:
        return f"{TO_BITS[d]}({expr})"
    return {DType.F32: f"__float_as_uint({expr})", DType.F64: f"(unsigned long long)__double_as_longlong({expr})"}.get(
        d, f"({ {1: 'unsigned char', 4: 'unsigned', 8: 'unsigned long long'}[d.itemsize]})({expr})")


def _from_bits(expr: str, d: DType) -> str:
    if d in BITS_TO:
        return f"{BITS_TO[d]}({expr})"
    return {DType.F32: f"__uint_as_float({expr})", DType.F64: f"__longlong_as_double((long long)({expr}))"}.get(
        d, f"({C_TYPES[d]})({expr})")


@rule(BitcastOp)
def emit_bitcast(em, op: BitcastOp) -> None:
    src, dst = op.operands[0].ttype.dtype, op.result.ttype.dtype
    em.assign(op, lambda i: _from_bits(_bits_of(em.operand(op.operands[0], i), src), dst))


@rule(CvtPackOp)
def emit_cvt_pack(em, op: CvtPackOp) -> None:
    dst = op.result.ttype.dtype
    x = op.operands[0]
    n = em.declare(op.result)
    conv = BITS_TO[dst]
    span = em.span
    em.emit("#pragma unroll")
    em.emit(f"for (int i = 0; i + 1 < {span}; i += 2) {{ const unsigned w = "
              f"{ptx.cvt_pack(em.elem(x, 'i + 1'), em.elem(x, 'i'), str(dst))}; "
              f"{n}[i] = {conv}((unsigned short)(w & 0xffffu)); {n}[i + 1] = {conv}((unsigned short)(w >> 16)); }}")
    if span % 2:
        em.emit(f"{n}[{span - 1}] = {em.from_float(em.elem(x, str(span - 1)), dst)};")


@rule(BroadcastOp)
def emit_broadcast(em, op: BroadcastOp) -> None:
    if em.kind(op.operands[0]) != "scalar":
        raise CodegenError(f"codegen broadcasts scalars to rows, not {op.operands[0].type}", op.loc)
    s = em.name(op.operands[0])
    em.assign(op, lambda i: s)
