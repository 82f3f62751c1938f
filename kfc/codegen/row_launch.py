"""The emission rule of gpu.launch over rows: each CTA strides over its rows (row slot kfc_r of
kfc_base), the cluster and shared memory set up before the loop; the ops after the row's last
reduction step, and runs of ops that end in a thread's reduction, are fused into one loop over
the thread's chunks; a loop whose results sum across rows keeps per-thread accumulators and
writes each row slot's partials for the second kernel (kfc.codegen.row_sums).
"""

from __future__ import annotations

from ..ir.core import Op
from ..ir.gpu_ops import LaunchOp, ThreadMaxSumExpOp, ThreadReduceOp
from ..ir.ptx_ops import LdOp, StOp
from ..ir.tile_ops import BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, IotaOp, ReduceKind, UnaryOp, WhereOp, YieldOp
from ..ir.types import TensorType
from . import pair_rules, ptx, reduction_rules, row_sums, smem_rules
from .c_names import C_TYPES
from .rules import rule


FUSABLE = (ConstOp, IotaOp, UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, BroadcastOp, LdOp, StOp, YieldOp)


def emit_sum_accumulators(em) -> None:
    for k in range(len(em.launch.results)):
        if em.launch.sums_in == "registers":
            em.emit(f"float kfc_acc{k}[{em.EV}];")
        em.emit("#pragma unroll")
        em.emit(f"for (int i = 0; i < {em.EV}; ++i) {acc(em, k, 'i')} = 0.0f;")


@rule(YieldOp)
def emit_yield(em, op) -> None:
    """A row's contributions to the sums across rows, added into the thread's accumulators.
    A row slot without a row adds nothing: in registers by a select (a branch around the adds
    made ptxas spill the register accumulators), in shared memory by a branch (the select
    made it spill a row of 4095 elements read one by one)."""
    at = f"e * {em.V} + i" if em.chunk_local is not None else "i"
    for k, v in enumerate(op.operands):
        if em.launch.sums_in == "registers":
            em.loop(f"{acc(em, k, at)} += kfc_rowvalid ? {em.elem(v, 'i')} : 0.0f;")
        else:
            em.loop(f"if (kfc_rowvalid) {acc(em, k, at)} += {em.elem(v, 'i')};")


def emit_partials(em) -> None:
    """Each row slot's sums, written whole into its row of the workspace (zeros where the
    slot had no row): the partials the second kernel adds up."""
    em.emit(f"const long long kfc_group = (long long)(blockIdx.x / {em.C}) * {em.R} + kfc_r;")
    for k in range(len(em.launch.results)):
        j = em.row.register_element_c("i", "kfc_g")
        em.emit("#pragma unroll")
        em.emit(f"for (int i = 0; i < {em.EV}; ++i) {{ if ({j} < {em.N}) "
                  f"{row_sums.workspace_name(k)}[kfc_group * {em.N}LL + {j}] = {acc(em, k, 'i')}; }}")


@rule(LaunchOp)
def emit_launch(em, L: LaunchOp) -> None:
    lo, hi = (em.name(v) for v in L.operands)
    row = L.body.args[0]
    em.names[row] = "kfc_m"
    if em.cluster_ops:
        reduction_rules.emit_cluster_setup(em)
    smem_rules.emit_smem_setup(em)
    if em.sums is not None:
        emit_sum_accumulators(em)
    em.emit(f"const long long kfc_rows = (long long)({hi}) - (long long)({lo});")
    em.emit(f"const long long kfc_stride = (long long)(gridDim.x / {em.C}) * {em.R};")
    em.emit("unsigned kfc_phase = 0;")
    if em.S > 1:
        em.emit("unsigned kfc_it = 0;")
        smem_rules.emit_first_copies(em, lo)
    em.emit(f"for (long long kfc_base = (long long)(blockIdx.x / {em.C}) * {em.R}; kfc_base < kfc_rows; "
              f"kfc_base += kfc_stride) {{")
    em.indent += 1
    em.emit(f"const long long kfc_m = (long long)({lo}) + kfc_base + kfc_r;")
    em.emit("const bool kfc_rowvalid = kfc_base + kfc_r < kfc_rows;")
    if em.S > 1:
        em.emit(f"const unsigned kfc_s = kfc_it % {em.S};")
    first_cluster = em.cluster_ops[0] if em.cluster_ops else None
    head, tail = split_tail(em, L.body.ops)
    runs = fused_reductions(em, head)
    skip: set[int] = set()
    for op in head:
        if id(op) in skip:
            continue
        if op is first_cluster:
            em.emit(ptx.cluster_wait())
        if id(op) in runs:
            run = runs[id(op)]
            skip.update(id(o) for o in run)
            emit_fused_reduction(em, run)
            continue
        em.emit_op(op)
    if tail:
        emit_fused_tail(em, tail)
    if em.staged:
        # the next row's copies overwrite the buffers: every thread must be done reading them
        em.emit("if (kfc_base + kfc_stride < kfc_rows) {")
        em.emit("  " + ptx.bar_sync(0))
        em.emit("}")
    if em.cluster_ops:
        # The next iteration's first cluster step waits on this: no CTA sends into a peer's
        # slots before the peer has read the last ones. After the last iteration nothing is
        # sent any more (each CTA has received every peer's value before it could finish),
        # so CTAs leave without waiting for each other. All CTAs of a cluster share one
        # row and so one trip count: arrives and waits pair up. (Placed right after the
        # row's last exchange instead, before its stores, rmsnorm_bwd ran 11% slower at
        # rows of 16384 to 131072 on the H200.)
        em.emit("if (kfc_base + kfc_stride < kfc_rows) {")
        em.emit("  " + ptx.cluster_arrive())
        em.emit("}")
    em.emit("kfc_phase ^= 1;")
    if em.S > 1:
        em.emit("++kfc_it;")
    em.indent -= 1
    em.emit("}")
    if em.sums is not None:
        emit_partials(em)


def split_tail(em, ops):
    """The ops after the last reduction step, when all of them can run chunk by chunk:
    emitted as one loop over the thread's chunks, the tail keeps one chunk of each of its
    row values in registers instead of the whole share (a weight row, products,
    conversions), which leaves room for more resident CTAs."""
    last = max((i for i, op in enumerate(ops) if op.NAME.startswith("gpu.")), default=-1)
    tail = list(ops[last + 1:])
    if not tail or not all(isinstance(op, FUSABLE) for op in tail):
        return list(ops), []
    if not any(r.type.layout is not None and r.type.layout.kind == "row" for op in tail for r in op.results
               if isinstance(r.type, TensorType)) and not any(isinstance(op, (StOp, YieldOp)) for op in tail):
        return list(ops), []
    return list(ops[:last + 1]), tail


def fused_reductions(em, ops) -> dict[int, list[Op]]:
    """Runs of ops that end in a per-thread reduction and whose row values nothing after
    the reduction reads (rows re-read from shared memory make such runs): each is emitted
    as one loop over the thread's chunks, accumulating chunk by chunk, so a thread never
    holds its whole share of the row. Keyed by the id of the run's first op."""
    runs: dict[int, list[Op]] = {}
    ops = list(ops)
    for j, op in enumerate(ops):
        if not isinstance(op, (ThreadReduceOp, ThreadMaxSumExpOp)):
            continue
        i = j  # back over fusable ops; a reduction ends the walk, so runs never overlap
        while i > 0 and isinstance(ops[i - 1], FUSABLE) and not isinstance(ops[i - 1], StOp):
            i -= 1
        run = ops[i:j + 1]
        inside = {id(o) for o in run}
        rows = [r for o in run[:-1] for r in o.results if em.kind(r) == "row"]
        if not any(isinstance(o, LdOp) for o in run) or not rows or \
                any(id(u) not in inside for r in rows for u in em.uses.get(r, ())):
            continue  # a row value of the run is read after it: it must stay whole
        runs[id(run[0])] = run
    return runs


def emit_fused_reduction(em, run) -> None:
    reduce_op = run[-1]
    d = em.check_reducible(reduce_op)
    body = []
    for op in run[:-1]:  # scalars first: they never depend on the run's row values
        if any(em.kind(v) == "row" for v in op.results):
            body.append(op)
        else:
            em.emit_op(op)
    if isinstance(reduce_op, ThreadMaxSumExpOp):
        m, s = (em.name(r) for r in reduce_op.results)
        em.emit(f"float {m} = {em.identity(ReduceKind.MAX)}, {s} = 0.0f;")
        # the pair is a chain through every chunk: unrolled whole, ptxas hoists every chunk's
        # loads ahead of it (softmax at odd rows of 262143: 32 one-element chunks, 128
        # registers and spills; four at a time, 59)
        made = {r for op in body for r in op.results}
        local = all(v in made for op in body for v in op.operands if em.kind(v) == "row")
        with em.chunk_loop(unroll=4 if local and em.E > 4 else 0):
            for op in body:
                em.emit_op(op)
            pair_rules.max_sumexp_chunk(em, reduce_op, f"(e * {em.V} + k)", "k")
        return
    acc = em.name(reduce_op.result)
    em.emit(f"{C_TYPES[d]} {acc} = {em.identity(reduce_op.kind, d)};")
    with em.chunk_loop():
        for op in body:
            em.emit_op(op)
        reduction_rules.thread_reduce_steps(em, reduce_op, f"(e * {em.V} + k)", "k", em.V)


def emit_fused_tail(em, tail) -> None:
    row_ops = []
    for op in tail:  # scalars first: they never depend on the tail's row values
        if any(em.kind(v) == "row" for v in op.results) or isinstance(op, (StOp, YieldOp)):
            row_ops.append(op)
        else:
            em.emit_op(op)
    with em.chunk_loop():
        for op in row_ops:
            em.emit_op(op)


def acc(em, k: int, i: str) -> str:
    """Element i of the thread's part of sum k (in registers or in its shared words)."""
    if em.launch.sums_in == "shared":
        return f"kfc_sums[({k * em.R * em.EV} + ({i})) * {em.T}]"
    return f"kfc_acc{k}[{i}]"
