"""Emission rules for the steps of a row reduction (lower-reductions): a thread's registers, a
warp's butterfly shuffles, a CTA's warps through shared slots, a cluster's CTAs through
st.async into every peer's slots on its mbarrier, and the uniform value that ends them.
"""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.gpu_ops import ClusterReduceOp, CtaReduceOp, ThreadReduceOp, UniformOp, WarpReduceOp
from . import ptx
from .c_names import C_TYPES
from .rules import rule


def emit_cluster_setup(em) -> None:
    for k, op in enumerate(em.cluster_ops):
        values = len(op.results)  # a (max, sum) pair sends two values a CTA
        em.smem_decls.append(f"__shared__ alignas(8) unsigned long long kfc_cbar{k};")
        em.smem_decls.append(f"__shared__ float kfc_cslot{k}[{values * em.C}];")
        em.smem_bytes += 8 + 4 * values * em.C
    em.emit("if (threadIdx.x == 0) {")
    em.indent += 1
    for k in range(len(em.cluster_ops)):
        em.emit(ptx.mbarrier_init(ptx.smem_addr(f"kfc_cbar{k}"), 1))
    em.emit(ptx.fence_mbarrier_init())
    em.indent -= 1
    em.emit("}")
    # the fence publishes the inits; a release arrive would add a GPU-wide membar (ncu:
    # 14% of softmax's stall samples at rows of 65536 sat on its ERRBAR)
    em.emit(ptx.cluster_arrive(relaxed=True))


@rule(ThreadReduceOp)
def emit_thread_reduce(em, op: ThreadReduceOp) -> None:
    d = em.check_reducible(op)
    em.emit(f"{C_TYPES[d]} {em.name(op.result)} = {em.identity(op.kind, d)};")
    thread_reduce_steps(em, op, "i", "i", em.EV)


def thread_reduce_steps(em, op: ThreadReduceOp, reg: str, i: str, count: int) -> None:
    """acc = f(acc, element) for `count` elements in register order; `reg` is the element's
    register index in the thread's share (for the bounds test), `i` its index in the
    operands' C arrays."""
    n, d = em.name(op.result), op.result.ttype.dtype
    if op.map == "mul":
        a, b = (em.elem(v, i) for v in op.operands)
        step = f"{n} = __fmaf_rn({a}, {b}, {n});"
    else:
        step = f"{n} = {em.combine(op.kind, n, em.elem(op.operands[0], i), d)};"
    if not em.exact:
        step = f"if {em.row.register_in_row_c(reg, 'kfc_g', em.N)} {{ {step} }}"
    em.emit("#pragma unroll")
    em.emit(f"for (int {i} = 0; {i} < {count}; ++{i}) {{ {step} }}")


@rule(WarpReduceOp)
def emit_warp_reduce(em, op: WarpReduceOp) -> None:
    n, d = em.name(op.result), op.result.ttype.dtype
    x = em.name(op.operands[0])
    em.emit(f"{C_TYPES[d]} {n} = {x};")
    k = op.width // 2
    while k >= 1:
        other = ptx.shfl_bfly(n, k) if d is DType.F32 else f"__shfl_xor_sync(0xffffffffu, {n}, {k})"
        em.emit(f"{n} = {em.combine(op.kind, n, other, d)};")
        k //= 2


@rule(CtaReduceOp, synchronises=True)
def emit_cta_reduce(em, op: CtaReduceOp) -> None:
    warps = em.T // 32
    k = em.fresh("kfc_red")
    em.smem_decls.append(f"__shared__ float {k}[2][{em.R}][{warps}];")
    em.smem_bytes += 2 * em.R * warps * 4
    x = em.name(op.operands[0])
    n, d = em.name(op.result), op.result.ttype.dtype
    bits, value = as_f32_bits(d)  # an i32 travels through the f32 slots bit for bit
    em.emit(f"if (kfc_lane == 0) {ptx.st_shared_f32(ptx.smem_addr(f'{k}[kfc_phase][kfc_r][kfc_t / 32]'), bits(x))}")
    em.emit(ptx.bar_sync(0))
    em.emit(f"{C_TYPES[d]} {n} = {value(ptx.ld_shared_f32(ptx.smem_addr(f'{k}[kfc_phase][kfc_r][0]')))};")
    em.emit("#pragma unroll")
    em.emit(f"for (int w = 1; w < {warps}; ++w) {n} = "
              f"{em.combine(op.kind, n, value(ptx.ld_shared_f32(ptx.smem_addr(f'{k}[kfc_phase][kfc_r][w]'))), d)};")


def cluster_exchange(em, op) -> str:
    """Each CTA sends its values of `op`'s operands to every CTA of the cluster (value i of
    rank r into slot i·C + r, through st.async on the peer's mbarrier) and waits until all
    of them are in: the slots' name, to combine in rank order."""
    k = em.cluster_ops.index(op)
    bar, slot, C = f"kfc_cbar{k}", f"kfc_cslot{k}", em.C
    values = [as_f32_bits(v.ttype.dtype)[0](em.name(v)) for v in op.operands]
    em.emit(f"if (threadIdx.x == 0) {ptx.mbarrier_arrive_expect_tx(ptx.smem_addr(bar), 4 * len(values) * C)}")
    em.emit(f"if (threadIdx.x < {C}) {{")
    em.indent += 1
    for i, x in enumerate(values):
        at = f"{i * C} + kfc_crank" if i else "kfc_crank"
        em.emit(ptx.st_async_f32(ptx.mapa(ptx.smem_addr(f"{slot}[{at}]"), "threadIdx.x"), x,
                                   ptx.mapa(ptx.smem_addr(bar), "threadIdx.x")))
    em.indent -= 1
    em.emit("}")
    em.emit(ptx.mbarrier_wait_parity(ptx.smem_addr(bar), "kfc_phase"))
    return slot


@rule(ClusterReduceOp, in_cluster=True)
def emit_cluster_reduce(em, op: ClusterReduceOp) -> None:
    slot = cluster_exchange(em, op)
    n, d = em.name(op.result), op.result.ttype.dtype
    value = as_f32_bits(d)[1]
    em.emit(f"{C_TYPES[d]} {n} = {value(f'{slot}[0]')};")
    em.emit("#pragma unroll")
    em.emit(f"for (int c = 1; c < {em.C}; ++c) {n} = {em.combine(op.kind, n, value(f'{slot}[c]'), d)};")


@rule(UniformOp)
def emit_uniform(em, op: UniformOp) -> None:
    em.emit(f"const {C_TYPES[op.result.ttype.dtype]} {em.name(op.result)} = {em.name(op.operands[0])};")


def as_f32_bits(dtype: DType):
    """How a reduction's value goes into an f32 slot and comes back out: as it is for f32,
    reinterpreted bit for bit for i32."""
    if dtype is DType.I32:
        return (lambda x: f"__int_as_float({x})"), (lambda x: f"__float_as_int({x})")
    return (lambda x: x), (lambda x: x)
