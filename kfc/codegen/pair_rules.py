"""Emission rules for (max, sum of exp(x - max)) pairs: the thread, warp, CTA and cluster steps of
`tile.max_sumexp` (gpu.*_max_sumexp).
"""

from __future__ import annotations

from ..ir.gpu_ops import ClusterMaxSumExpOp, CtaMaxSumExpOp, ThreadMaxSumExpOp, WarpMaxSumExpOp
from ..ir.tile_ops import ReduceKind
from . import ptx, reduction_rules
from .rules import rule


def exp_of_difference(op, a: str, b: str) -> str:
    if op.approx:
        return f"kfc_ex2_approx(({a} - {b}) * 1.4426950408889634f)"
    return f"expf({a} - {b})"


def pair_combine(em, op, m: str, s: str, om: str, os_: str) -> None:
    """(m, s) ⊕= (om, os): the larger maximum, each sum rescaled to it; an exponent of a
    maximum of -inf is taken as 0, so lanes without elements add nothing."""
    em.emit(f"{{ const float nm = {ptx.max_nan(m, om)}; const float at = nm == __int_as_float(0xff800000) ? "
              f"0.0f : nm; {s} = {s} * {exp_of_difference(op, m, 'at')} + {os_} * "
              f"{exp_of_difference(op, om, 'at')}; {m} = nm; }}")


def max_sumexp_chunk(em, op, reg: str, i: str) -> None:
    """One chunk of V elements into the thread's running pair: the chunk's maximum, the
    running sum rescaled to the new maximum once, then the chunk's exponentials added."""
    m, s = (em.name(r) for r in op.results)
    x = em.elem(op.operands[0], i)
    guard = "" if em.exact else f"if {em.row.register_in_row_c(reg, 'kfc_g', em.N)} "
    em.emit("{")
    em.indent += 1
    em.emit(f"float cm = {em.identity(ReduceKind.MAX)};")
    em.emit("#pragma unroll")
    em.emit(f"for (int {i} = 0; {i} < {em.V}; ++{i}) {{ {guard}{{ cm = {ptx.max_nan('cm', x)}; }} }}")
    em.emit(f"const float nm = {ptx.max_nan(m, 'cm')};")
    em.emit("const float at = nm == __int_as_float(0xff800000) ? 0.0f : nm;")
    em.emit(f"{s} = {m} == nm ? {s} : {s} * {exp_of_difference(op, m, 'at')};")
    em.emit("#pragma unroll")
    em.emit(f"for (int {i} = 0; {i} < {em.V}; ++{i}) {{ {guard}{{ {s} += "
              f"{exp_of_difference(op, x, 'at')}; }} }}")
    em.emit(f"{m} = nm;")
    em.indent -= 1
    em.emit("}")


@rule(ThreadMaxSumExpOp)
def emit_thread_max_sum_exp(em, op: ThreadMaxSumExpOp) -> None:
    """The thread's whole share in registers: its maximum, then the sum against it."""
    m, s = (em.name(r) for r in op.results)
    x = em.elem(op.operands[0], "i")
    guard = "" if em.exact else f"if {em.row.register_in_row_c('i', 'kfc_g', em.N)} "
    em.emit(f"float {m} = {em.identity(ReduceKind.MAX)}, {s} = 0.0f;")
    em.emit("#pragma unroll")
    em.emit(f"for (int i = 0; i < {em.EV}; ++i) {{ {guard}{{ {m} = {ptx.max_nan(m, x)}; }} }}")
    at = em.fresh("kfc_at")
    em.emit(f"const float {at} = {m} == __int_as_float(0xff800000) ? 0.0f : {m};")
    em.emit("#pragma unroll")
    em.emit(f"for (int i = 0; i < {em.EV}; ++i) {{ {guard}{{ {s} += {exp_of_difference(op, x, at)}; }} }}")


@rule(WarpMaxSumExpOp)
def emit_warp_max_sum_exp(em, op: WarpMaxSumExpOp) -> None:
    m, s = (em.name(r) for r in op.results)
    em.emit(f"float {m} = {em.name(op.operands[0])}, {s} = {em.name(op.operands[1])};")
    k = op.width // 2
    while k >= 1:
        om, os_ = em.fresh("kfc_om"), em.fresh("kfc_os")
        em.emit(f"const float {om} = {ptx.shfl_bfly(m, k)}, {os_} = {ptx.shfl_bfly(s, k)};")
        pair_combine(em, op, m, s, om, os_)
        k //= 2


@rule(CtaMaxSumExpOp, synchronises=True)
def emit_cta_max_sum_exp(em, op: CtaMaxSumExpOp) -> None:
    warps = em.T // 32
    k = em.fresh("kfc_red")
    em.smem_decls.append(f"__shared__ float {k}[2][{em.R}][2][{warps}];")
    em.smem_bytes += 2 * em.R * 2 * warps * 4
    xm, xs = (em.name(v) for v in op.operands)
    m, s = (em.name(r) for r in op.results)
    slot = f"{k}[kfc_phase][kfc_r]"
    em.emit(f"if (kfc_lane == 0) {{ {ptx.st_shared_f32(ptx.smem_addr(f'{slot}[0][kfc_t / 32]'), xm)} "
              f"{ptx.st_shared_f32(ptx.smem_addr(f'{slot}[1][kfc_t / 32]'), xs)} }}")
    em.emit(ptx.bar_sync(0))
    em.emit(f"float {m} = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[0][0]'))}, "
              f"{s} = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[1][0]'))};")
    em.emit("#pragma unroll")
    em.emit(f"for (int w = 1; w < {warps}; ++w) {{")
    em.indent += 1
    em.emit(f"const float om = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[0][w]'))}, "
              f"os = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[1][w]'))};")
    pair_combine(em, op, m, s, "om", "os")
    em.indent -= 1
    em.emit("}")


@rule(ClusterMaxSumExpOp, in_cluster=True)
def emit_cluster_max_sum_exp(em, op: ClusterMaxSumExpOp) -> None:
    slot, C = reduction_rules.cluster_exchange(em, op), em.C
    m, s = (em.name(r) for r in op.results)
    em.emit(f"float {m} = {slot}[0], {s} = {slot}[{C}];")
    em.emit("#pragma unroll")
    em.emit(f"for (int c = 1; c < {C}; ++c) {{")
    em.indent += 1
    em.emit(f"const float om = {slot}[c], os = {slot}[{C} + c];")
    pair_combine(em, op, m, s, "om", "os")
    em.indent -= 1
    em.emit("}")
