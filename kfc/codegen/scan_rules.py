"""Emission rules for scans along a row (`tile.scan`): in-thread scans, segmented shuffles across
a warp, warps' totals through shared memory, a running carry across chunks.
"""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.tile_ops import ReduceKind, ScanOp
from . import ptx
from .c_names import C_TYPES
from .errors import CodegenError
from .rules import rule


@rule(ScanOp, synchronises=True)
def emit_scan(em, op: ScanOp) -> None:
    """A prefix reduction along the row, in the row's order (chunk e of every lane before
    chunk e + 1), or a suffix one with reverse: each thread scans its chunks' elements, a
    segmented shuffle scan of the chunk totals runs across a warp's lanes, shared memory
    carries the warps' totals across the CTA, and a running carry crosses the chunks.
    Elements past the row's end come after every real one: a forward scan needs nothing
    of them, a reverse one, which meets them first, reads them as the identity."""
    x, r = op.operands[0], op.result
    if em.kind(r) != "row":
        raise CodegenError("codegen scans whole rows (a #row tile)", op.loc)
    if em.C > 1:
        raise CodegenError("a scan over a row split across a cluster", op.loc,
                           "leave tile's cluster at 0: a row with a scan stays in one CTA")
    d = x.ttype.dtype
    if d not in (DType.F32, DType.I32):
        raise CodegenError(f"codegen scans f32 or i32 rows, not {d}", op.loc, "cast the row first: cumsum(f32(x))")
    ct = C_TYPES[d]

    def comb(a, b):
        return em.combine(op.kind, a, b, d)
    ident = em.identity(op.kind, d)
    rev = op.reverse
    n = em.declare(r)
    E, V, T, R = em.E, em.V, em.T, em.R
    seg, warps = min(T, 32), max(1, T // 32)
    lane = f"(kfc_lane % {seg})"
    u = em.fresh("kfc_scan")
    x_at = em.elem(x, f"e * {V} + k")
    if rev and not em.exact:
        x_at = f"({em.row.register_in_row_c(f'(e * {V} + k)', 'kfc_g', em.N)} ? {x_at} : ({ct})({ident}))"
    step = (f"{n}[e * {V} + k] = run; run = {comb('run', x_at)};" if op.exclusive
            else f"run = {comb('run', x_at)}; {n}[e * {V} + k] = run;")
    ks = f"int k = {V - 1}; k >= 0; --k" if rev else f"int k = 0; k < {V}; ++k"
    es = f"int e = {E - 1}; e >= 0; --e" if rev else f"int e = 0; e < {E}; ++e"
    shfl = ptx.shfl_down if rev else ptx.shfl_up
    em.emit(f"{ct} {u}_inc[{E}];  // each chunk's total {'from' if rev else 'up to'} this lane, in its warp")
    em.emit("#pragma unroll")
    em.emit(f"for (int e = 0; e < {E}; ++e) {{")
    em.emit(f"  {ct} run = {ident};")
    em.emit("  #pragma unroll")
    em.emit(f"  for ({ks}) {{ {step} }}")
    em.emit(f"  {ct} v = run;")
    off = 1
    while off < seg:
        ok = f"{lane} + {off} < {seg}" if rev else f"{lane} >= {off}"
        em.emit(f"  {{ const {ct} y = {shfl('v', off, seg, ct)}; if ({ok}) v = {comb('y', 'v')}; }}")
        off *= 2
    em.emit(f"  {u}_inc[e] = v;")
    em.emit("}")
    if warps > 1:  # a warp's total sits in its first lane (reverse) or its last
        em.smem_decls.append(f"__shared__ {ct} {u}_w[2][{R}][{E}][{warps}];")
        em.smem_bytes += 2 * R * E * warps * d.itemsize
        em.emit(f"if (kfc_lane == {0 if rev else 31}) {{ for (int e = 0; e < {E}; ++e) "
                  f"{u}_w[kfc_phase][kfc_r][e][kfc_t / 32] = {u}_inc[e]; }}")
        em.emit(ptx.bar_sync(0))
    em.emit(f"{ct} {u}_carry = {ident};  // the chunks {'after' if rev else 'before'}")
    em.emit("#pragma unroll")
    em.emit(f"for ({es}) {{")
    em.indent += 1
    em.emit(f"{ct} lanes_past = {shfl(f'{u}_inc[e]', 1, seg, ct)};")
    em.emit(f"if ({lane} == {seg - 1 if rev else 0}) lanes_past = {ident};")
    if warps > 1:
        past = "w > kfc_t / 32" if rev else "w < kfc_t / 32"
        em.emit(f"{ct} warps_past = {ident}, total = {ident};")
        # unrolled whole, ptxas hoists every chunk's reads of every warp's total (E x warps
        # registers): suffix_scans spilled at rows of 16384
        em.emit("#pragma unroll 4")
        em.emit(f"for (int w = 0; w < {warps}; ++w) {{ const {ct} t = {u}_w[kfc_phase][kfc_r][e][w]; "
                  f"if ({past}) warps_past = {comb('warps_past', 't')}; total = {comb('total', 't')}; }}")
        past_all = comb(f"{u}_carry", comb("warps_past", "lanes_past"))
    else:
        em.emit(f"const {ct} total = {ptx.shfl_idx(f'{u}_inc[e]', 0 if rev else seg - 1, seg, ct)};")
        past_all = comb(f"{u}_carry", "lanes_past")
    em.emit(f"const {ct} past = {past_all};")
    em.emit("#pragma unroll")
    em.emit(f"for (int k = 0; k < {V}; ++k) {n}[e * {V} + k] = {comb('past', f'{n}[e * {V} + k]')};")
    em.emit(f"{u}_carry = {comb(f'{u}_carry', 'total')};")
    em.indent -= 1
    em.emit("}")
