"""CUDA C++ from a mapped, PTX-lowered row program (see kfc.passes.rows for its shape).

Each thread runs the row body for its rows. A `#row` tile becomes a per-thread register array
of E·vec elements (E = ceil(N / (vec·threads·cluster)); element i = e·vec + v of thread g is
row element (e·threads·cluster + g)·vec + v); a scalar is one variable every thread holds; a
`#lanes` value is one variable per thread. Loads, stores, shuffles, shared and distributed
shared memory, and the approximate functions are inline PTX from kfc.codegen.ptx. The rules for
for and if (control_rules), (max, sum) pairs (pair_rules) and scans (scan_rules) live in their
own modules, mixed into the emitter.
"""

from __future__ import annotations

import contextlib
import math

import attrs

from ..ir.core import Op, Value, walk_block
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.gpu_ops import (
    ClusterMaxSumExpOp, ClusterReduceOp, CtaReduceOp, LaunchOp, ThreadMaxSumExpOp, ThreadReduceOp,
    UniformOp, WarpReduceOp,
)
from ..ir import layouts
from ..ir.ptx_ops import CvtPackOp, Ex2ApproxOp, LdOp, RsqrtApproxOp, StOp
from ..ir.smem_ops import (
    CopyAsyncOp, ExpectTxOp, MbarrierAllocOp, MbarrierWaitOp, SmemAllocOp, copies_not_indexed_by_row, copy_bytes,
)
from ..ir.tile_ops import (
    BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, IndexDim, IotaOp, ReduceKind, UnaryOp,
    WhereOp, YieldOp,
)
from ..ir.types import MemSpace, SymDim, TensorType
from . import ptx, row_sums
from .errors import CodegenError
from .control_rules import ControlRules
from .pair_rules import PairRules
from .scan_rules import ScanRules
from .c_names import BITS_TO, C_TYPES, TO_BITS, KernelParam, as_float, c_dim, c_kernel, c_param, from_float

@attrs.frozen
class LaunchPlan:
    """What the runtime needs to launch the kernel: the launch contract's entry for it
    (`contract()`), plus the row mapping it came from (for reports)."""

    kernel: str
    params: tuple[KernelParam, ...]
    block: int
    cluster: int
    rows_per_cta: int
    persistent: bool
    rows_expr: str       # an ir/constexpr expression of the dims: the number of rows
    smem_static: int
    smem_dynamic: int = 0
    # dims the launch defines for the kernels after it: expressions of the dims and kfc_grid_x
    defines: tuple[tuple[str, str], ...] = ()
    followers: tuple[dict, ...] = ()  # the contract entries of the kernels launched after this one
    min_ctas_per_sm: int = 0  # CTAs the kernel was compiled to fit on an SM (__launch_bounds__); 0: ptxas's choice

    @property
    def grid(self) -> tuple[str, str, str]:
        """The grid as ir/constexpr expressions of the dims: CTAs for every row batch (a
        cluster of CTAs per batch), before a persistent launch caps it at one wave."""
        rows = f"max(0, {self.rows_expr})"
        return (f"(({rows}) + {self.rows_per_cta - 1}) // {self.rows_per_cta} * {self.cluster}", "1", "1")

    def contract(self) -> dict:
        entry = {"name": self.kernel, "grid": list(self.grid), "block": [self.block, 1, 1],
                 "cluster": [self.cluster, 1, 1], "smem_static_bytes": self.smem_static,
                 "smem_dynamic_bytes": self.smem_dynamic, "persistent": self.persistent,
                 "params": [p.contract() for p in self.params],
                 "rows": self.rows_expr, "rows_per_cta": self.rows_per_cta}
        if self.defines:
            entry["defines"] = dict(self.defines)
        if self.min_ctas_per_sm:
            entry["min_ctas_per_sm"] = self.min_ctas_per_sm
        return entry

    def contracts(self) -> list[dict]:
        """Every kernel of the op, in launch order (the launch contract's "kernels")."""
        return [self.contract(), *self.followers]


def _f32_literal(v: float) -> str:
    """A C float literal that rounds to the same f32 as numpy does (repr is exact for doubles)."""
    if math.isnan(v):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(v):
        return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return f"{float(v)!r}f"


def literal(value, dtype: DType) -> str:
    if dtype.is_float:
        text = _f32_literal(float(value))
        if dtype is DType.F32:
            return text
        if dtype is DType.F64:
            return text[:-1] if text.endswith("f") else f"(double){text}"
        return f"({C_TYPES[dtype]})({text})"
    if dtype.is_bool:
        return "true" if value else "false"
    return f"({C_TYPES[dtype]})({int(value)}LL)"


class RowKernelEmitter(ControlRules, PairRules, ScanRules):
    def __init__(self, func: FuncOp, kernel_name: str) -> None:
        self.func = func
        self.kernel_name = kernel_name
        launches = [op for op in func.body.ops if isinstance(op, LaunchOp)]
        if len(launches) != 1:
            raise CodegenError(f"codegen needs one gpu.launch at the top of {func.sym_name}; run the tile pass",
                               func.loc, "use the default pipeline, or include tile{...} in -p")
        self.launch = launches[0]
        self.names: dict[Value, str] = {}
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.smem_decls: list[str] = []
        self.smem_bytes = 0
        self.cluster_ops: list[Op] = [op for op in self.launch.body.ops
                                      if isinstance(op, (ClusterReduceOp, ClusterMaxSumExpOp))]
        L = self.launch
        self.T, self.V, self.C, self.R = L.threads, L.vec, L.cluster, L.rows_per_cta
        self.row = layouts.Blocked1D(L.threads, L.vec, L.cluster)  # every row tile's layout (the verifier agrees)
        self.P = self.row.lanes
        self.N = self._row_length()
        self.E = self.row.chunks(self.N)
        self.EV = self.E * self.V
        self.exact = self.row.exact(self.N)
        # inside a fused per-chunk loop: values declared there hold one chunk (vec elements),
        # not the thread's whole share of the row
        self.chunk_local: set[Value] | None = None
        self.smem_dynamic = 0
        self.stage_bytes: dict[Value, int] = {}  # a staged buffer's bytes per stage (all row slots)
        self.stage_base: dict[Value, str] = {}   # a staged buffer's or barrier's stage-0 address
        self.staged = [op for op in self.launch.body.ops if isinstance(op, SmemAllocOp)]
        self.bars = [op for op in self.launch.body.ops if isinstance(op, MbarrierAllocOp)]
        # copies of each staged buffer: with 2 the next row's copies are issued while this row
        # computes (kfc_s: this iteration's stage)
        self.S = max((op.stages for op in self.bars), default=1)
        if self.S > 1:
            for op in copies_not_indexed_by_row(self.launch.body):
                raise CodegenError("a copy issued a row ahead (stages=2) is indexed by the row itself", op.loc,
                                   "use tile{stages=1} for this op")
        self.uses: dict[Value, list[Op]] = {}
        for op in self.launch.body.ops:
            for v in self.operands_within(op):
                self.uses.setdefault(v, []).append(op)
        # sums across rows: one f32 accumulator per element a thread holds, per result
        self.sums = row_sums.plan_row_sums(func, self.launch, self.N, CodegenError) if self.launch.results else None

    # --- naming -------------------------------------------------------------------------------
    @staticmethod
    def operands_within(op: Op) -> list[Value]:
        """What an op reads, the ops of its regions' reads included (a for loop's body)."""
        return [v for inner in op.walk() for v in inner.operands]

    def _row_length(self) -> int:
        for op in walk_block(self.launch.body):
            for r in op.results:
                t = r.type
                if isinstance(t, TensorType) and t.layout is not None and t.layout.kind == "row":
                    return int(t.shape[0])
        return 0

    def fresh(self, hint: str = "v") -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def name(self, v: Value) -> str:
        if v not in self.names:
            self.names[v] = self.fresh()
        return self.names[v]

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def kind(self, v: Value) -> str:
        t = v.ttype
        if t.space is not MemSpace.REG:
            return "tensor"
        if t.layout is not None and t.layout.kind == "row":
            return "row"
        if t.layout is not None and t.layout.kind == "lanes":
            return "lanes"
        if t.rank == 0:
            return "scalar"
        raise CodegenError(f"a rank-{t.rank} tile {t} without a row layout reached codegen", None,
                           "run tile before lower-reductions and lower-ptx")

    def elem(self, v: Value, i: str) -> str:
        """Element i of a row value (of the current chunk, inside the fused tail), or the value
        itself for scalars and lanes."""
        if self.kind(v) != "row":
            return self.name(v)
        if self.chunk_local is not None and v not in self.chunk_local:
            return f"{self.name(v)}[e * {self.V} + {i}]"
        return f"{self.name(v)}[{i}]"

    def chunk_elem(self, v: Value, k: int) -> str:
        """Element k of chunk e of a row value, in a loop over chunks e."""
        if self.chunk_local is not None and v in self.chunk_local:
            return f"{self.name(v)}[{k}]"
        return f"{self.name(v)}[e * {self.V} + {k}]"

    as_float = staticmethod(as_float)
    from_float = staticmethod(from_float)

    # --- the kernel ---------------------------------------------------------------------------
    def generate(self) -> tuple[str, LaunchPlan]:
        params = self.params()
        sig = ", ".join(self.param_decl(p) for p in params)
        for v in self.func.args:
            self.names[v] = c_param(v.name)
        self.emit(f"const int kfc_t = threadIdx.x % {self.T};")
        self.emit(f"const int kfc_r = threadIdx.x / {self.T};")
        self.emit("const int kfc_lane = threadIdx.x % 32;")
        if self.C > 1:
            self.emit(f"const unsigned kfc_crank = {ptx.cluster_ctarank()};")
        else:
            self.emit("const unsigned kfc_crank = 0;")
        self.emit(f"const int kfc_g = (int)kfc_crank * {self.T} + kfc_t;")
        after_launch = False
        for op in self.func.body.ops:
            if op is self.launch:
                self.emit_launch()
                if self.sums is not None:
                    break  # what follows uses the launch's sums: the second kernel's (row_sums)
                after_launch = True
                continue
            if after_launch and (op.has_trait("writes_memory") or op.has_trait("reads_memory")):
                raise CodegenError(f"{op.NAME} after the row loop: a row kernel reads and writes memory inside its "
                                   "loop only", op.loc, "move it into the parallel loop (a sum across rows is "
                                   "written out[:] += ... inside it)")
            self.emit_op(op, top=True)
        body = "\n".join(self.lines)
        smem = "\n".join("  " + d for d in self.smem_decls)
        block = self.R * self.T
        bounds = f"{block}, {self.launch.min_ctas_per_sm}" if self.launch.min_ctas_per_sm else f"{block}"
        code = (f'extern "C" __global__ void __launch_bounds__({bounds}) {self.kernel_name}({sig}) {{\n'
                f"{smem}\n{body}\n}}\n")
        defines, followers = (), ()
        if self.sums is not None:
            results = len(self.launch.results)
            code += "\n" + row_sums.emit_row_sums(self.sums, self.sums_kernel_name, results)
            # one partial per row slot of each cluster of the (persistent) grid
            defines = ((row_sums.GROUPS_DIM, f"kfc_grid_x // {self.C} * {self.R}"),)
            followers = (row_sums.contract(self.sums, self.sums_kernel_name, results),)
        plan = LaunchPlan(self.kernel_name, tuple(params), block, self.C, self.R, self.launch.persistent,
                          self.rows_expr(), self.smem_bytes, self.smem_dynamic, defines, followers,
                          self.launch.min_ctas_per_sm)
        return code, plan

    # --- sums across rows -----------------------------------------------------------------------
    @property
    def sums_kernel_name(self) -> str:
        return f"{self.kernel_name}_sums"


    def acc(self, k: int, i: str) -> str:
        """Element i of the thread's part of sum k (in registers or in its shared words)."""
        if self.launch.sums_in == "shared":
            return f"kfc_sums[({k * self.R * self.EV} + ({i})) * {self.T}]"
        return f"kfc_acc{k}[{i}]"

    def emit_sum_accumulators(self) -> None:
        for k in range(len(self.launch.results)):
            if self.launch.sums_in == "registers":
                self.emit(f"float kfc_acc{k}[{self.EV}];")
            self.emit("#pragma unroll")
            self.emit(f"for (int i = 0; i < {self.EV}; ++i) {self.acc(k, 'i')} = 0.0f;")

    def op_YieldOp(self, op) -> None:
        """A row's contributions to the sums across rows, added into the thread's accumulators
        (a row slot without a row adds zero: a select, where a branch around the adds made
        ptxas spill the accumulators)."""
        at = f"e * {self.V} + i" if self.chunk_local is not None else "i"
        for k, v in enumerate(op.operands):
            self.loop(f"{self.acc(k, at)} += kfc_rowvalid ? {self.elem(v, 'i')} : 0.0f;")

    def emit_partials(self) -> None:
        """Each row slot's sums, written whole into its row of the workspace (zeros where the
        slot had no row): the partials the second kernel adds up."""
        self.emit(f"const long long kfc_group = (long long)(blockIdx.x / {self.C}) * {self.R} + kfc_r;")
        for k in range(len(self.launch.results)):
            j = self.row.register_element_c("i", "kfc_g")
            self.emit("#pragma unroll")
            self.emit(f"for (int i = 0; i < {self.EV}; ++i) {{ if ({j} < {self.N}) "
                      f"{row_sums.workspace_name(k)}[kfc_group * {self.N}LL + {j}] = {self.acc(k, 'i')}; }}")

    def params(self) -> list[KernelParam]:
        out = []
        outputs = set(self.func.outputs)
        for v in self.func.args:
            t = v.ttype
            if t.space is MemSpace.REG:
                out.append(KernelParam(v.name, "scalar", C_TYPES[t.dtype], str(t.dtype)))
            else:
                out.append(KernelParam(v.name, "tensor", C_TYPES[t.dtype], str(t.dtype), t.optional, v in outputs))
        if self.sums is not None:
            out.extend(row_sums.workspace_params(len(self.launch.results), self.N))
        for s in self.func.symbols:
            out.append(KernelParam(s, "dim", "long long", "index"))
        return out

    @staticmethod
    def param_decl(p: KernelParam) -> str:
        if p.kind in ("tensor", "workspace"):
            const = "" if p.is_output else "const "
            return f"{const}{p.ctype}* __restrict__ {p.cname}"
        return f"{p.ctype} {p.cname}"

    def rows_expr(self) -> str:
        """The number of rows as Python over the dims (for the runtime's grid size)."""
        lo, hi = self.launch.operands
        return f"({self._py_expr(hi)}) - ({self._py_expr(lo)})"

    def _py_expr(self, v: Value) -> str:
        d = next((op for op in self.func.body.ops if v in op.results), None)
        if isinstance(d, ConstOp):
            return str(int(d.value))
        if isinstance(d, DimOp):
            return d.sym
        if isinstance(d, BinaryOp) and d.NAME in ("tile.add", "tile.sub", "tile.mul"):
            sym = {"tile.add": "+", "tile.sub": "-", "tile.mul": "*"}[d.NAME]
            return f"({self._py_expr(d.operands[0])} {sym} {self._py_expr(d.operands[1])})"
        if isinstance(d, CastOp):
            return self._py_expr(d.operands[0])
        raise CodegenError("the row loop's bounds must be dims and constants", self.launch.loc)

    def emit_launch(self) -> None:
        L = self.launch
        lo, hi = (self.name(v) for v in L.operands)
        row = L.body.args[0]
        self.names[row] = "kfc_m"
        if self.cluster_ops:
            self.emit_cluster_setup()
        self.emit_smem_setup()
        if self.sums is not None:
            self.emit_sum_accumulators()
        self.emit(f"const long long kfc_rows = (long long)({hi}) - (long long)({lo});")
        self.emit(f"const long long kfc_stride = (long long)(gridDim.x / {self.C}) * {self.R};")
        self.emit("unsigned kfc_phase = 0;")
        if self.S > 1:
            self.emit("unsigned kfc_it = 0;")
            self.emit_first_copies(lo)
        self.emit(f"for (long long kfc_base = (long long)(blockIdx.x / {self.C}) * {self.R}; kfc_base < kfc_rows; "
                  f"kfc_base += kfc_stride) {{")
        self.indent += 1
        self.emit(f"const long long kfc_m = (long long)({lo}) + kfc_base + kfc_r;")
        self.emit("const bool kfc_rowvalid = kfc_base + kfc_r < kfc_rows;")
        if self.S > 1:
            self.emit(f"const unsigned kfc_s = kfc_it % {self.S};")
        first_cluster = self.cluster_ops[0] if self.cluster_ops else None
        head, tail = self.split_tail(L.body.ops)
        runs = self.fused_reductions(head)
        skip: set[int] = set()
        for op in head:
            if id(op) in skip:
                continue
            if op is first_cluster:
                self.emit(ptx.cluster_wait())
            if id(op) in runs:
                run = runs[id(op)]
                skip.update(id(o) for o in run)
                self.emit_fused_reduction(run)
                continue
            self.emit_op(op)
        if tail:
            self.emit_fused_tail(tail)
        if self.staged:
            # the next row's copies overwrite the buffers: every thread must be done reading them
            self.emit("if (kfc_base + kfc_stride < kfc_rows) {")
            self.emit("  " + ptx.bar_sync(0))
            self.emit("}")
        if self.cluster_ops:
            # The next iteration's first cluster step waits on this: no CTA sends into a peer's
            # slots before the peer has read the last ones. After the last iteration nothing is
            # sent any more (each CTA has received every peer's value before it could finish),
            # so CTAs leave without waiting for each other. All CTAs of a cluster share one
            # row and so one trip count: arrives and waits pair up. (Placed right after the
            # row's last exchange instead, before its stores, rmsnorm_bwd ran 11% slower at
            # rows of 16384 to 131072 on the H200.)
            self.emit("if (kfc_base + kfc_stride < kfc_rows) {")
            self.emit("  " + ptx.cluster_arrive())
            self.emit("}")
        self.emit("kfc_phase ^= 1;")
        if self.S > 1:
            self.emit("++kfc_it;")
        self.indent -= 1
        self.emit("}")
        if self.sums is not None:
            self.emit_partials()

    FUSABLE = (ConstOp, IotaOp, UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, BroadcastOp, LdOp, StOp, YieldOp)

    def split_tail(self, ops):
        """The ops after the last reduction step, when all of them can run chunk by chunk:
        emitted as one loop over the thread's chunks, the tail keeps one chunk of each of its
        row values in registers instead of the whole share (a weight row, products,
        conversions), which leaves room for more resident CTAs."""
        last = max((i for i, op in enumerate(ops) if op.NAME.startswith("gpu.")), default=-1)
        tail = list(ops[last + 1:])
        if not tail or not all(isinstance(op, self.FUSABLE) for op in tail):
            return list(ops), []
        if not any(r.type.layout is not None and r.type.layout.kind == "row" for op in tail for r in op.results
                   if isinstance(r.type, TensorType)) and not any(isinstance(op, (StOp, YieldOp)) for op in tail):
            return list(ops), []
        return list(ops[:last + 1]), tail

    def fused_reductions(self, ops) -> dict[int, list[Op]]:
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
            while i > 0 and isinstance(ops[i - 1], self.FUSABLE) and not isinstance(ops[i - 1], StOp):
                i -= 1
            run = ops[i:j + 1]
            inside = {id(o) for o in run}
            rows = [r for o in run[:-1] for r in o.results if self.kind(r) == "row"]
            if not any(isinstance(o, LdOp) for o in run) or not rows or \
                    any(id(u) not in inside for r in rows for u in self.uses.get(r, ())):
                continue  # a row value of the run is read after it: it must stay whole
            runs[id(run[0])] = run
        return runs

    def emit_fused_reduction(self, run) -> None:
        reduce_op = run[-1]
        self._check_f32(reduce_op)
        body = []
        for op in run[:-1]:  # scalars first: they never depend on the run's row values
            if any(self.kind(v) == "row" for v in op.results):
                body.append(op)
            else:
                self.emit_op(op)
        if isinstance(reduce_op, ThreadMaxSumExpOp):
            m, s = (self.name(r) for r in reduce_op.results)
            self.emit(f"float {m} = {self.identity(ReduceKind.MAX)}, {s} = 0.0f;")
            # the pair is a chain through every chunk: unrolled whole, ptxas hoists every chunk's
            # loads ahead of it (softmax at odd rows of 262143: 32 one-element chunks, 128
            # registers and spills; four at a time, 59)
            made = {r for op in body for r in op.results}
            local = all(v in made for op in body for v in op.operands if self.kind(v) == "row")
            with self.chunk_loop(unroll=4 if local and self.E > 4 else 0):
                for op in body:
                    self.emit_op(op)
                self.max_sumexp_chunk(reduce_op, f"(e * {self.V} + k)", "k")
            return
        acc = self.name(reduce_op.result)
        self.emit(f"float {acc} = {self.identity(reduce_op.kind)};")
        with self.chunk_loop():
            for op in body:
                self.emit_op(op)
            self.thread_reduce_steps(reduce_op, f"(e * {self.V} + k)", "k", self.V)

    def cta_part_bytes(self, buffer: TensorType) -> int:
        """The bytes of one staged row this CTA holds: its spans, the last one padded."""
        return self.E * self.row.span * buffer.dtype.itemsize

    def emit_smem_setup(self) -> None:
        """Shared-memory buffers (one part per row slot of the CTA, in dynamic shared memory)
        and mbarriers (one per row slot), initialised before the row loop."""
        bars = self.bars
        shared_sums = self.sums is not None and self.launch.sums_in == "shared"
        if not self.staged and not bars and not shared_sums:
            return
        offset = 0
        if self.staged or shared_sums:
            self.smem_decls.append("extern __shared__ __align__(128) unsigned char kfc_dsmem[];")
        for k, op in enumerate(self.staged):
            t = op.result.ttype
            if t.rank != 1 or t.shape[0] != self.N:
                raise CodegenError(f"a shared-memory buffer of {t} in a row kernel of rows of {self.N}", op.loc,
                                   "stage whole rows: buffers have the row's length")
            part = self.cta_part_bytes(t)
            name = f"kfc_sbuf{k}"
            self.emit(f"const unsigned {name} = {ptx.smem_addr('kfc_dsmem[0]')} + {offset}u + "
                      f"(unsigned)kfc_r * {part}u;")
            stage = -(-self.R * part // 128) * 128
            self.stage_bytes[op.result] = stage
            self.stage_base[op.result] = name
            self.names[op.result] = name if self.S == 1 else f"({name} + kfc_s * {stage}u)"
            offset += self.S * stage
        if shared_sums:
            # each thread's words: [result][row slot][register][thread], so that a warp's
            # accesses to one register fall in distinct banks
            self.emit(f"float* const kfc_sums = reinterpret_cast<float*>(kfc_dsmem + {offset}) + "
                      f"kfc_r * {self.EV * self.T} + kfc_t;")
            offset += len(self.launch.results) * self.R * self.EV * self.T * 4
        self.smem_dynamic = offset
        if not self.staged and not bars:
            return
        for k, op in enumerate(bars):
            if op.arrivals != 1:
                raise CodegenError(f"row kernels arrive once per mbarrier phase, not {op.arrivals} times", op.loc)
            self.smem_decls.append(f"__shared__ alignas(8) unsigned long long kfc_mbar{k}[{self.S * self.R}];")
            self.smem_bytes += 8 * self.S * self.R
            self.stage_base[op.result] = f"kfc_mbar_addr{k}"
            self.names[op.result] = f"kfc_mbar_addr{k}" if self.S == 1 else \
                f"(kfc_mbar_addr{k} + kfc_s * {8 * self.R}u)"
        self.emit("if (threadIdx.x == 0) {")
        self.indent += 1
        self.emit(f"for (int r = 0; r < {self.S * self.R}; ++r) {{")
        for k in range(len(bars)):
            self.emit("  " + ptx.mbarrier_init(ptx.smem_addr(f"kfc_mbar{k}[r]"), 1))
        self.emit("}")
        self.emit(ptx.fence_mbarrier_init())
        self.emit(ptx.fence_proxy_async_shared())
        self.indent -= 1
        self.emit("}")
        self.emit(ptx.bar_sync(0))
        for k in range(len(bars)):
            self.emit(f"const unsigned kfc_mbar_addr{k} = {ptx.smem_addr(f'kfc_mbar{k}[kfc_r]')};")

    def emit_fused_tail(self, tail) -> None:
        row_ops = []
        for op in tail:  # scalars first: they never depend on the tail's row values
            if any(self.kind(v) == "row" for v in op.results) or isinstance(op, (StOp, YieldOp)):
                row_ops.append(op)
            else:
                self.emit_op(op)
        with self.chunk_loop():
            for op in row_ops:
                self.emit_op(op)

    @contextlib.contextmanager
    def chunk_loop(self, unroll: int = 0):
        """A loop over the thread's chunks e, inside which row values hold one chunk each;
        unrolled whole unless `unroll` says how far (only where no row value from outside the
        loop is indexed by e: a register array needs constant indices)."""
        self.emit(f"#pragma unroll {unroll}" if unroll else "#pragma unroll")
        self.emit(f"for (int e = 0; e < {self.E}; ++e) {{")
        self.indent += 1
        self.chunk_local = set()
        try:
            yield
        finally:
            self.chunk_local = None
            self.indent -= 1
        self.emit("}")

    def emit_cluster_setup(self) -> None:
        for k, op in enumerate(self.cluster_ops):
            values = len(op.results)  # a (max, sum) pair sends two values a CTA
            self.smem_decls.append(f"__shared__ alignas(8) unsigned long long kfc_cbar{k};")
            self.smem_decls.append(f"__shared__ float kfc_cslot{k}[{values * self.C}];")
            self.smem_bytes += 8 + 4 * values * self.C
        self.emit("if (threadIdx.x == 0) {")
        self.indent += 1
        for k in range(len(self.cluster_ops)):
            self.emit(ptx.mbarrier_init(ptx.smem_addr(f"kfc_cbar{k}"), 1))
        self.emit(ptx.fence_mbarrier_init())
        self.indent -= 1
        self.emit("}")
        # the fence publishes the inits; a release arrive would add a GPU-wide membar (ncu:
        # 14% of softmax's stall samples at rows of 65536 sat on its ERRBAR)
        self.emit(ptx.cluster_arrive(relaxed=True))

    # --- ops ----------------------------------------------------------------------------------
    def declare(self, v: Value) -> str:
        """Declare the C variable for result v; returns its name."""
        n = self.name(v)
        k = self.kind(v)
        ct = C_TYPES[v.ttype.dtype]
        if k == "row" and self.chunk_local is not None:
            self.emit(f"{ct} {n}[{self.V}];")
            self.chunk_local.add(v)
        elif k == "row":
            self.emit(f"{ct} {n}[{self.EV}];")
        else:
            self.emit(f"{ct} {n};")
        return n

    @property
    def span(self) -> int:
        """Elements a row loop covers: the thread's share, or one chunk in the fused tail."""
        return self.V if self.chunk_local is not None else self.EV

    def loop(self, body: str) -> None:
        self.emit("#pragma unroll")
        self.emit(f"for (int i = 0; i < {self.span}; ++i) {{ {body} }}")

    def emit_op(self, op: Op, top: bool = False) -> None:
        handler = getattr(self, "op_" + type(op).__name__, None)
        if handler is None:
            for base in type(op).__mro__[1:]:
                handler = getattr(self, "op_" + base.__name__, None)
                if handler is not None:
                    break
        if handler is None:
            raise CodegenError(f"codegen has no rule for {op.NAME}", op.loc,
                               "this op must be lowered by a pass before codegen")
        handler(op)

    def assign(self, op: Op, expr_of_i) -> None:
        """Result = f(element i) over a row, or once for scalars/lanes."""
        r = op.result
        n = self.declare(r)
        if self.kind(r) == "row":
            self.loop(f"{n}[i] = {expr_of_i('i')};")
        else:
            self.emit(f"{n} = {expr_of_i(None)};")

    def operand(self, v: Value, i):
        return self.elem(v, i) if i is not None else self.name(v)

    def op_ConstOp(self, op: ConstOp) -> None:
        t = op.result.ttype
        lit = literal(op.value, t.dtype)
        if self.kind(op.result) == "row":
            n = self.declare(op.result)
            self.loop(f"{n}[i] = {lit};")
        else:
            self.emit(f"const {C_TYPES[t.dtype]} {self.name(op.result)} = {lit};")

    def op_IotaOp(self, op: IotaOp) -> None:
        """Each element its own row index (a register's, from the layout; in a chunk loop,
        chunk e's)."""
        if self.kind(op.result) != "row":
            raise CodegenError(f"iota makes a row here, not {op.result.type}", op.loc)
        ct = C_TYPES[op.result.ttype.dtype]
        n = self.declare(op.result)
        if self.chunk_local is not None:
            self.loop(f"{n}[i] = ({ct})({self.row.chunk_start_c('e', 'kfc_g')} + i);")
        else:
            self.loop(f"{n}[i] = ({ct})({self.row.register_element_c('i', 'kfc_g')});")

    def op_DimOp(self, op: DimOp) -> None:
        self.emit(f"const long long {self.name(op.result)} = {c_dim(op.sym)};")

    def op_UnaryOp(self, op: UnaryOp) -> None:
        fn = op.NAME.split(".")[1]
        d = op.operands[0].ttype.dtype
        x = op.operands[0]

        def expr(i):
            a = self.operand(x, i)
            if d.is_float:
                f = self.as_float(a, d)
                if isinstance(op, RsqrtApproxOp):
                    return ptx.rsqrt_approx(f)
                if isinstance(op, Ex2ApproxOp):
                    return ptx.ex2_approx(f)
                e = {
                    "neg": f"(-{f})", "abs": f"fabsf({f})", "exp": f"expf({f})", "exp2": f"exp2f({f})",
                    "log": f"logf({f})", "log2": f"log2f({f})", "sqrt": f"sqrtf({f})",
                    "rsqrt": f"(1.0f / sqrtf({f}))", "sigmoid": f"(1.0f / (1.0f + expf(-{f})))",
                    "softplus": f"({f} > 20.0f ? {f} : log1pf(expf({f})))", "tanh": f"tanhf({f})",
                }[fn]
                if d is DType.F64:
                    e = e.replace("f(", "(").replace("1.0f", "1.0").replace("20.0f", "20.0")
                return self.from_float(e, d)
            e = {"neg": f"(-{a})", "abs": f"({a} < 0 ? -{a} : {a})",
                 "not": f"(!{a})" if d.is_bool else f"(~{a})"}[fn]
            return e

        self.assign(op, expr)

    def op_BinaryOp(self, op: BinaryOp) -> None:
        fn = op.NAME.split(".")[1]
        d = op.operands[0].ttype.dtype
        a_v, b_v = op.operands

        def expr(i):
            a, b = self.operand(a_v, i), self.operand(b_v, i)
            if d.is_float:
                fa, fb = self.as_float(a, d), self.as_float(b, d)
                if d is DType.F64:
                    e = {"add": f"({fa} + {fb})", "sub": f"({fa} - {fb})", "mul": f"({fa} * {fb})",
                         "div": f"({fa} / {fb})", "max": f"fmax({fa}, {fb})", "min": f"fmin({fa}, {fb})",
                         "pow": f"pow({fa}, {fb})", "rem": f"({fa} - floor({fa} / {fb}) * {fb})"}[fn]
                    return e
                e = {"add": f"({fa} + {fb})", "sub": f"({fa} - {fb})", "mul": f"({fa} * {fb})",
                     "div": f"({fa} / {fb})", "max": ptx.max_nan(fa, fb), "min": ptx.min_nan(fa, fb),
                     "pow": f"powf({fa}, {fb})", "rem": f"({fa} - floorf({fa} / {fb}) * {fb})"}[fn]
                return self.from_float(e, d)
            if d.is_bool:
                return {"and": f"({a} && {b})", "or": f"({a} || {b})", "xor": f"({a} != {b})",
                        "max": f"({a} || {b})", "min": f"({a} && {b})"}[fn]
            return {"add": f"({a} + {b})", "sub": f"({a} - {b})", "mul": f"({a} * {b})",
                    "div": f"kfc_floordiv({a}, {b})", "rem": f"kfc_floormod({a}, {b})",
                    "max": f"({a} > {b} ? {a} : {b})", "min": f"({a} < {b} ? {a} : {b})",
                    "and": f"({a} & {b})", "or": f"({a} | {b})", "xor": f"({a} ^ {b})"}[fn]

        self.assign(op, expr)

    def op_CmpOp(self, op: CmpOp) -> None:
        sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op.pred.value]
        d = op.operands[0].ttype.dtype

        def expr(i):
            a, b = (self.as_float(self.operand(v, i), d) for v in op.operands)
            return f"({a} {sym} {b})"

        self.assign(op, expr)

    def op_WhereOp(self, op: WhereOp) -> None:
        c, a, b = op.operands
        self.assign(op, lambda i: f"({self.operand(c, i)} ? {self.operand(a, i)} : {self.operand(b, i)})")

    def op_CastOp(self, op: CastOp) -> None:
        src, dst = op.operands[0].ttype.dtype, op.result.ttype.dtype
        x = op.operands[0]

        def expr(i):
            a = self.operand(x, i)
            if src.is_float and dst.is_float:
                return self.from_float(self.as_float(a, src), dst) if DType.F64 not in (src, dst) else \
                    f"({C_TYPES[dst]})({self.as_float(a, src)})"
            if src.is_float:
                return f"({C_TYPES[dst]})({self.as_float(a, src)})"
            if dst.is_float:
                return self.from_float(f"(float)({a})", dst)
            return f"({C_TYPES[dst]})({a})"

        self.assign(op, expr)

    def op_CvtPackOp(self, op: CvtPackOp) -> None:
        dst = op.result.ttype.dtype
        x = op.operands[0]
        n = self.declare(op.result)
        conv = BITS_TO[dst]
        span = self.span
        self.emit("#pragma unroll")
        self.emit(f"for (int i = 0; i + 1 < {span}; i += 2) {{ const unsigned w = "
                  f"{ptx.cvt_pack(self.elem(x, 'i + 1'), self.elem(x, 'i'), str(dst))}; "
                  f"{n}[i] = {conv}((unsigned short)(w & 0xffffu)); {n}[i + 1] = {conv}((unsigned short)(w >> 16)); }}")
        if span % 2:
            self.emit(f"{n}[{span - 1}] = {self.from_float(self.elem(x, str(span - 1)), dst)};")

    def op_BroadcastOp(self, op: BroadcastOp) -> None:
        if self.kind(op.operands[0]) != "scalar":
            raise CodegenError(f"codegen broadcasts scalars to rows, not {op.operands[0].type}", op.loc)
        s = self.name(op.operands[0])
        self.assign(op, lambda i: s)

    # --- memory -------------------------------------------------------------------------------
    def _address(self, op, tensor: Value, index: tuple[IndexDim, ...], idx_operands, elem_offset: str) -> str:
        """Element offset of the access in the tensor (row-major, contiguous)."""
        t = tensor.ttype
        strides = []
        acc = "1"
        for d in reversed(t.shape):
            strides.append(acc)
            acc = f"({acc} * {self._dim(d)})"
        strides.reverse()
        it = iter(idx_operands)
        terms = []
        for dim, (ix, stride) in enumerate(zip(index, strides)):
            if ix.kind == "point":
                terms.append(f"(long long)({self.name(next(it))}) * {stride}")
            elif ix.kind == "all":
                if dim != len(index) - 1:
                    raise CodegenError("a row access takes the whole last dim only", op.loc)
                terms.append(f"({elem_offset})")
            else:
                if dim != len(index) - 1:
                    raise CodegenError("a row access slices the last dim only", op.loc,
                                       "index x[m, k:k+64], not a slice of an earlier dim")
                terms.append(f"((long long)({self.name(next(it))}) + ({elem_offset}))")
                if ix.limit:
                    next(it)
        return " + ".join(terms) if terms else "0"

    def slice_conds(self, tensor: Value, index: tuple[IndexDim, ...], idx_operands, elem_offset: str) -> list[str]:
        """What must hold for the element at `elem_offset` of a sliced access (x[m, k:k+64],
        with or without a limit) to lie inside the tensor and below the limit: the tile has its
        own length, the tensor may end inside it."""
        it = iter(idx_operands)
        conds = []
        for ix, d in zip(index, tensor.ttype.shape):
            if ix.kind == "point":
                next(it)
            elif ix.kind == "slice":
                at = f"(long long)({self.name(next(it))}) + ({elem_offset})"
                # unsigned: a start read from memory may be negative, and must not reach below the tensor
                conds.append(f"(unsigned long long)({at}) < (unsigned long long)({self._dim(d)})")
                if ix.limit:
                    conds.append(f"{at} < (long long)({self.name(next(it))})")
        return conds

    def _dim(self, d) -> str:
        if isinstance(d, int):
            return f"{d}LL"
        if isinstance(d, SymDim):
            return f"({c_dim(d.name)} + {d.offset}LL)" if d.offset else c_dim(d.name)
        raise CodegenError(f"bad dim {d}")

    def _chunk_pred(self, e: str) -> str | None:
        """Whether chunk e of this thread lies inside the row (None when it always does)."""
        if self.exact:
            return None
        return self.row.in_row_c(e, "kfc_g", self.N)

    def op_LdOp(self, op: LdOp) -> None:
        tensor = op.operands[0]
        t = tensor.ttype
        r = op.result
        d = t.dtype
        n = self.declare(r)
        other = literal(op.other, d)
        guard = f"{self.name(tensor)} != nullptr" if t.optional else None
        if self.kind(r) != "row":
            addr = self._address(op, tensor, op.index, op.operands[1:], "0")
            conds = self.scalar_access_conds(op, tensor, op.index, op.operands[1:], guard)
            self.emit(f"{n} = {other};")
            self.emit(f"if ({' && '.join(conds)}) {n} = {self.name(tensor)}[{addr}];")
            return
        shared = t.space is MemSpace.SHARED
        word, nwords, per_word, accesses, pred = self.access_plan(op, d, guard)
        self.open_chunks()
        base = self.row.chunk_start_c("e", "kfc_g")
        for a in range(accesses):
            words = [self.fresh("w") for _ in range(nwords)]
            wt = "unsigned" if word == 4 else "unsigned short"
            fill = self._other_bits(op.other, d, word)
            self.emit(f"{wt} {', '.join(f'{w} = {fill}' for w in words)};")
            if shared:  # this CTA's part of a staged row: its spans one after another
                offset = f"({self.row.cta_offset_c('e', 'kfc_t')} + {a * op.vec})"
                self.emit(ptx.ld_shared(words, f"{self.name(tensor)} + (unsigned)({offset}) * {d.itemsize}u", pred,
                                        word))
            else:
                at = f"{base} + {a * op.vec}"
                addr = f"{self.name(tensor)} + {self._address(op, tensor, op.index, op.operands[1:], at)}"
                self.emit(ptx.ld_global(words, addr, self.with_slice(pred, tensor, op.index, op.operands[1:], at),
                                        op.cache, word))
            for wi, w in enumerate(words):
                for k in range(per_word):
                    self.emit(f"{self.chunk_elem(r, a * op.vec + wi * per_word + k)} = {self._from_bits(w, d, k, word)};")
        self.close_chunks()

    def with_slice(self, pred: str | None, tensor: Value, index, idx_operands, at: str) -> str | None:
        """An access's predicate with its slices' bounds at element `at` (a vector of the
        tile pass's width never straddles them: the tensor's dim and the slice's start are
        multiples of it)."""
        conds = ([pred] if pred else []) + self.slice_conds(tensor, index, idx_operands, at)
        return " && ".join(conds) if conds else None

    def scalar_access_conds(self, op, tensor: Value, index: tuple[IndexDim, ...], idx_operands,
                            guard: str | None) -> list[str]:
        """What must hold for one element's load or store to stay inside its tensor: the row is
        one of the op's (the last CTA may hold fewer rows than it has slots), the optional
        tensor is present, and every point index lies in its dim (an index read from memory,
        such as a label, can be anything)."""
        conds = ["kfc_rowvalid"] if self.row_dependent(op) else []
        if guard:
            conds.append(f"({guard})")
        it = iter(idx_operands)
        for ix, d in zip(index, tensor.ttype.shape):
            if ix.kind == "point":
                conds.append(f"(unsigned long long)({self.name(next(it))}) < (unsigned long long)({self._dim(d)})")
        return conds or ["true"]

    def access_plan(self, op, d: DType, guard: str | None):
        """How a chunk of `vec` elements moves: 32-bit words (16-bit for 2-byte accesses), words
        per access, elements per word, accesses per chunk, and the predicate of chunk e."""
        acc_bytes = op.vec * d.itemsize
        word = 4 if acc_bytes >= 4 else 2
        nwords = max(1, acc_bytes // word)
        per_word = word // d.itemsize if d.itemsize < word else 1
        conds = ["kfc_rowvalid"] if self.row_dependent(op) else []
        if (p := self._chunk_pred("e")) is not None:
            conds.append(p)
        if guard:
            conds.append(f"({guard})")
        return word, nwords, per_word, self.V // op.vec, " && ".join(conds) if conds else None

    def open_chunks(self) -> None:
        """A loop over the thread's chunks e, unless the fused tail's loop already provides e."""
        if self.chunk_local is None:
            self.emit("#pragma unroll")
            self.emit(f"for (int e = 0; e < {self.E}; ++e) {{")
            self.indent += 1

    def close_chunks(self) -> None:
        if self.chunk_local is None:
            self.indent -= 1
            self.emit("}")

    def row_dependent(self, op) -> bool:
        idx = op.operands[1:] if isinstance(op, LdOp) else op.operands[2:]
        if not hasattr(self, "_deps"):
            self._deps = self.launch.row_dependent_values()
        dep = self._deps
        return any(v in dep for v in idx)

    def _other_bits(self, value, d: DType, word: int) -> str:
        import numpy as np

        raw = np.asarray(value).astype(d.np).tobytes()
        per = word // len(raw) if len(raw) < word else 1
        bits = int.from_bytes(raw * per, "little")
        return f"{bits}u"

    def _from_bits(self, w: str, d: DType, k: int, word: int) -> str:
        if d in (DType.BF16, DType.F16):
            part = f"(unsigned short)(({w} >> {16 * k}) & 0xffffu)" if word == 4 else w
            return f"{BITS_TO[d]}({part})"
        if d is DType.F32:
            return f"__uint_as_float({w})"
        if d is DType.I32:
            return f"(int)({w})"
        raise CodegenError(f"row loads of {d} are not supported yet")

    def _to_bits(self, x: str, d: DType) -> str:
        if d in (DType.BF16, DType.F16):
            return f"(unsigned){TO_BITS[d]}({x})"
        if d is DType.F32:
            return f"__float_as_uint({x})"
        if d is DType.I32:
            return f"(unsigned)({x})"
        raise CodegenError(f"row stores of {d} are not supported yet")

    def op_StOp(self, op: StOp) -> None:
        value, tensor = op.operands[0], op.operands[1]
        t = tensor.ttype
        d = t.dtype
        guard = f"{self.name(tensor)} != nullptr" if t.optional else None
        if self.kind(value) != "row":
            addr = self._address(op, tensor, op.index, op.operands[2:], "0")
            cond = ["kfc_t == 0", "kfc_crank == 0"] + self.scalar_access_conds(op, tensor, op.index, op.operands[2:],
                                                                               guard)
            self.emit(f"if ({' && '.join(cond)}) {self.name(tensor)}[{addr}] = {self.name(value)};")
            return
        word, nwords, per_word, accesses, pred = self.access_plan(op, d, guard)
        self.open_chunks()
        base = self.row.chunk_start_c("e", "kfc_g")
        for a in range(accesses):
            words = []
            for wi in range(nwords):
                parts = []
                for k in range(per_word):
                    bits = self._to_bits(self.chunk_elem(value, a * op.vec + wi * per_word + k), d)
                    parts.append(f"({bits} << {16 * k})" if per_word > 1 else bits)
                w = self.fresh("s")
                wt = "unsigned" if word == 4 else "unsigned short"
                self.emit(f"const {wt} {w} = ({wt})({' | '.join(parts)});")
                words.append(w)
            at = f"{base} + {a * op.vec}"
            addr = f"{self.name(tensor)} + {self._address(op, tensor, op.index, op.operands[2:], at)}"
            self.emit(ptx.st_global(words, addr, self.with_slice(pred, tensor, op.index, op.operands[2:], at),
                                    op.cache, word))
        self.close_chunks()

    # --- shared memory and bulk copies ----------------------------------------------------------
    def op_SmemAllocOp(self, op: SmemAllocOp) -> None:
        pass  # laid out in dynamic shared memory before the row loop (emit_smem_setup)

    def op_MbarrierAllocOp(self, op: MbarrierAllocOp) -> None:
        pass  # declared and initialised before the row loop (emit_smem_setup)

    def copies_on(self, bar: Value) -> list[CopyAsyncOp]:
        return [o for o in self.launch.body.ops if isinstance(o, CopyAsyncOp) and o.operands[2] is bar]

    def op_ExpectTxOp(self, op: ExpectTxOp) -> None:
        """Thread 0 of the row slot arrives and announces the bytes its CTA's copies carry
        (the IR's count is the whole row's; a cluster splits it); a slot without a row only
        arrives, so every slot's phase completes. With two stages this is where the next row's
        announcement and copies go, into the other stage (the first row's precede the loop)."""
        if self.S == 1:
            self.emit_expect_tx(op, "kfc_rowvalid", self.name(op.operands[0]))
            return
        self.emit("if (kfc_base + kfc_stride < kfc_rows) {")
        self.indent += 1
        self.emit("const bool kfc_valid_next = kfc_base + kfc_stride + kfc_r < kfc_rows;")
        self.emit(f"const unsigned kfc_sn = (kfc_s + 1) % {self.S};")
        self.emit_stage_copies(op, "kfc_valid_next", "kfc_sn", "(kfc_m + kfc_stride)")
        self.indent -= 1
        self.emit("}")

    def emit_first_copies(self, lo: str) -> None:
        """The copies of the CTA's first rows, into stage 0, before the row loop."""
        self.emit(f"if ((long long)(blockIdx.x / {self.C}) * {self.R} < kfc_rows) {{")
        self.indent += 1
        self.emit(f"const bool kfc_valid0 = (long long)(blockIdx.x / {self.C}) * {self.R} + kfc_r < kfc_rows;")
        first = f"((long long)({lo}) + (long long)(blockIdx.x / {self.C}) * {self.R} + kfc_r)"
        for op in self.launch.body.ops:
            if isinstance(op, ExpectTxOp):
                self.emit_stage_copies(op, "kfc_valid0", "0u", first)
        self.indent -= 1
        self.emit("}")

    def emit_stage_copies(self, expect: ExpectTxOp, valid: str, stage: str, row: str) -> None:
        """Announce and issue the copies on `expect`'s barrier for the row `row`, into `stage`."""
        bar = expect.operands[0]
        bar_at = f"({self.stage_base[bar]} + ({stage}) * {8 * self.R}u)"
        self.emit_expect_tx(expect, valid, bar_at)
        row_value = self.launch.body.args[0]
        saved = self.names[row_value]
        self.names[row_value] = row
        try:
            for c in self.copies_on(bar):
                buf = c.operands[1]
                self.emit_copy(c, valid, f"({self.stage_base[buf]} + ({stage}) * {self.stage_bytes[buf]}u)", bar_at)
        finally:
            self.names[row_value] = saved

    def emit_expect_tx(self, op: ExpectTxOp, valid: str, bar: str) -> None:
        copies = self.copies_on(op.operands[0])
        if op.bytes != sum(copy_bytes(c.operands[1].ttype) for c in copies):
            raise CodegenError(f"gpu.expect_tx announces {op.bytes} bytes; the copies on its barrier carry "
                               f"{sum(copy_bytes(c.operands[1].ttype) for c in copies)}", op.loc)
        per_cta = sum(self.cta_part_bytes(c.operands[1].ttype) for c in copies)
        if per_cta >= 1 << 20:
            raise CodegenError(f"a CTA's part of the staged rows is {per_cta} bytes; an mbarrier phase counts at most "
                               f"2^20-1", op.loc, "split the row over a larger cluster")
        self.emit("if (kfc_t == 0) {")
        self.indent += 1
        self.emit("unsigned kfc_tx = 0;")
        for c in copies:
            isz = c.operands[1].ttype.dtype.itemsize
            self.emit(f"for (int e = 0; e < {self.E}; ++e) {{ const long long j0 = {self.row.cta_span_start_c('e', 'kfc_crank')}; "
                      f"if (j0 < {self.N}) kfc_tx += (unsigned)({self.row.span_length_c('j0', self.N)} * {isz}); }}")
        self.emit(f"if ({valid}) {ptx.mbarrier_arrive_expect_tx_var(bar, 'kfc_tx')}")
        self.emit(f"else {ptx.mbarrier_arrive(bar)}")
        self.indent -= 1
        self.emit("}")

    def op_CopyAsyncOp(self, op: CopyAsyncOp) -> None:
        if self.S == 1:  # with two stages the copies go with their announcement (op_ExpectTxOp)
            self.emit_copy(op, "kfc_rowvalid", self.name(op.operands[1]), self.name(op.operands[2]))

    def emit_copy(self, op: CopyAsyncOp, valid: str, buf: str, bar: str) -> None:
        """Thread 0 of the row slot copies each of its CTA's spans of the row in one bulk copy
        (the last span stops at the row's end: both ends stay 16-byte aligned because the
        row's byte length is a multiple of 16)."""
        src = op.operands[0]
        t = src.ttype
        isz = t.dtype.itemsize
        if [ix.kind for ix in op.index] != ["point"] * (t.rank - 1) + ["all"]:
            raise CodegenError("row kernels copy whole rows (x[m, :]) into shared memory", op.loc)
        if (self.N * isz) % 16 or (self.row.span * isz) % 16:
            raise CodegenError(f"a bulk copy moves multiples of 16 bytes; rows of {self.N} x {isz} bytes in spans of "
                               f"{self.row.span} elements do not split so", op.loc,
                               "leave this row in registers (stage-rows skips such rows)")
        self.emit(f"if (kfc_t == 0 && {valid}) {{")
        self.indent += 1
        self.emit(ptx.fence_proxy_async_shared())
        self.emit("#pragma unroll")
        self.emit(f"for (int e = 0; e < {self.E}; ++e) {{")
        self.indent += 1
        self.emit(f"const long long j0 = {self.row.cta_span_start_c('e', 'kfc_crank')};")
        self.emit(f"if (j0 < {self.N}) {{")
        self.indent += 1
        self.emit(f"const unsigned kfc_nb = (unsigned)({self.row.span_length_c('j0', self.N)} * {isz});")
        addr = f"{self.name(src)} + {self._address(op, src, op.index, op.operands[3:], 'j0')}"
        dst = f"{buf} + (unsigned)({self.row.cta_offset_c('e', '0')}) * {isz}u"
        self.emit(ptx.cp_async_bulk_to_shared(dst, addr, "kfc_nb", bar))
        self.indent -= 1
        self.emit("}")
        self.indent -= 1
        self.emit("}")
        self.indent -= 1
        self.emit("}")

    def op_MbarrierWaitOp(self, op: MbarrierWaitOp) -> None:
        # one phase per iteration; with two stages each barrier completes every other iteration
        parity = "kfc_phase" if self.S == 1 else f"((kfc_it / {self.S}) & 1u)"
        self.emit(ptx.mbarrier_wait_parity(self.name(op.operands[0]), parity))

    # --- reductions ---------------------------------------------------------------------------
    def combine(self, kind: ReduceKind, a: str, b: str) -> str:
        return {ReduceKind.SUM: f"({a} + {b})", ReduceKind.PROD: f"({a} * {b})",
                ReduceKind.MAX: ptx.max_nan(a, b), ReduceKind.MIN: ptx.min_nan(a, b)}[kind]

    @staticmethod
    def identity(kind: ReduceKind) -> str:
        return {ReduceKind.SUM: "0.0f", ReduceKind.PROD: "1.0f", ReduceKind.MAX: "__int_as_float(0xff800000)",
                ReduceKind.MIN: "__int_as_float(0x7f800000)"}[kind]

    def _check_f32(self, op) -> None:
        if op.operands[0].ttype.dtype is not DType.F32:
            raise CodegenError(f"row reductions run in f32; this one is {op.operands[0].ttype.dtype}", op.loc,
                               "convert the row to f32 before reducing it")

    def op_ThreadReduceOp(self, op: ThreadReduceOp) -> None:
        self._check_f32(op)
        self.emit(f"float {self.name(op.result)} = {self.identity(op.kind)};")
        self.thread_reduce_steps(op, "i", "i", self.EV)

    def thread_reduce_steps(self, op: ThreadReduceOp, reg: str, i: str, count: int) -> None:
        """acc = f(acc, element) for `count` elements in register order; `reg` is the element's
        register index in the thread's share (for the bounds test), `i` its index in the
        operands' C arrays."""
        n = self.name(op.result)
        if op.map == "mul":
            a, b = (self.elem(v, i) for v in op.operands)
            step = f"{n} = __fmaf_rn({a}, {b}, {n});"
        else:
            step = f"{n} = {self.combine(op.kind, n, self.elem(op.operands[0], i))};"
        if not self.exact:
            step = f"if {self.row.register_in_row_c(reg, 'kfc_g', self.N)} {{ {step} }}"
        self.emit("#pragma unroll")
        self.emit(f"for (int {i} = 0; {i} < {count}; ++{i}) {{ {step} }}")

    def op_WarpReduceOp(self, op: WarpReduceOp) -> None:
        n = self.name(op.result)
        x = self.name(op.operands[0])
        self.emit(f"float {n} = {x};")
        k = op.width // 2
        while k >= 1:
            self.emit(f"{n} = {self.combine(op.kind, n, ptx.shfl_bfly(n, k))};")
            k //= 2

    def op_CtaReduceOp(self, op: CtaReduceOp) -> None:
        warps = self.T // 32
        k = self.fresh("kfc_red")
        self.smem_decls.append(f"__shared__ float {k}[2][{self.R}][{warps}];")
        self.smem_bytes += 2 * self.R * warps * 4
        x = self.name(op.operands[0])
        n = self.name(op.result)
        self.emit(f"if (kfc_lane == 0) {ptx.st_shared_f32(ptx.smem_addr(f'{k}[kfc_phase][kfc_r][kfc_t / 32]'), x)}")
        self.emit(ptx.bar_sync(0))
        self.emit(f"float {n} = {ptx.ld_shared_f32(ptx.smem_addr(f'{k}[kfc_phase][kfc_r][0]'))};")
        self.emit("#pragma unroll")
        self.emit(f"for (int w = 1; w < {warps}; ++w) {n} = "
                  f"{self.combine(op.kind, n, ptx.ld_shared_f32(ptx.smem_addr(f'{k}[kfc_phase][kfc_r][w]')))};")

    def cluster_exchange(self, op) -> str:
        """Each CTA sends its values of `op`'s operands to every CTA of the cluster (value i of
        rank r into slot i·C + r, through st.async on the peer's mbarrier) and waits until all
        of them are in: the slots' name, to combine in rank order."""
        k = self.cluster_ops.index(op)
        bar, slot, C = f"kfc_cbar{k}", f"kfc_cslot{k}", self.C
        values = [self.name(v) for v in op.operands]
        self.emit(f"if (threadIdx.x == 0) {ptx.mbarrier_arrive_expect_tx(ptx.smem_addr(bar), 4 * len(values) * C)}")
        self.emit(f"if (threadIdx.x < {C}) {{")
        self.indent += 1
        for i, x in enumerate(values):
            at = f"{i * C} + kfc_crank" if i else "kfc_crank"
            self.emit(ptx.st_async_f32(ptx.mapa(ptx.smem_addr(f"{slot}[{at}]"), "threadIdx.x"), x,
                                       ptx.mapa(ptx.smem_addr(bar), "threadIdx.x")))
        self.indent -= 1
        self.emit("}")
        self.emit(ptx.mbarrier_wait_parity(ptx.smem_addr(bar), "kfc_phase"))
        return slot

    def op_ClusterReduceOp(self, op: ClusterReduceOp) -> None:
        slot = self.cluster_exchange(op)
        n = self.name(op.result)
        self.emit(f"float {n} = {slot}[0];")
        self.emit("#pragma unroll")
        self.emit(f"for (int c = 1; c < {self.C}; ++c) {n} = {self.combine(op.kind, n, f'{slot}[c]')};")

    def op_UniformOp(self, op: UniformOp) -> None:
        self.emit(f"const float {self.name(op.result)} = {self.name(op.operands[0])};")


def _has_rule(op: Op) -> bool:
    return any(hasattr(RowKernelEmitter, "op_" + c.__name__) for c in type(op).__mro__)


def unlowered_ops(func: FuncOp) -> list[Op]:
    """Ops inside the kernel's gpu.launch that the code generator has no rule for (a pipeline
    that stops short of lower-ptx leaves tile-level loads and reductions there)."""
    return [op for launch in func.body.ops if isinstance(launch, LaunchOp)
            for op in launch.body.ops if not _has_rule(op)]


HEADER = """// generated by kfc: do not edit; regenerate with `kfc compile`
#include <cuda_bf16.h>
#include <cuda_fp16.h>
"""

INTEGER_HELPERS = ptx.definitions(r"""
static __device__ __forceinline__ long long kfc_floordiv(long long a, long long b) {
  long long q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static __device__ __forceinline__ long long kfc_floormod(long long a, long long b) {
  long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
""".lstrip("\n"))


def generate_cuda(func: FuncOp, kernel_name: str | None = None) -> tuple[str, LaunchPlan]:
    name = kernel_name or c_kernel(func.sym_name)
    emitter = RowKernelEmitter(func, name)
    code, plan = emitter.generate()
    return HEADER + "\n" + ptx.device_functions_used(code, {**ptx.DEVICE_FUNCTIONS, **INTEGER_HELPERS}) + "\n" + code, plan
