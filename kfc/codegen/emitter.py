"""The kernel emitter: what every emission rule (kfc.codegen.rules) writes through.

It names values, writes lines, and holds each value's form in the kernel, from its type's
layout (kfc.ir.layouts): a `#row` tile is a per-thread register array of E·vec elements
(E = ceil(N / (vec·threads·cluster)); element i = e·vec + v of lane g is row element
(e·threads·cluster + g)·vec + v), a `#lanes` value one variable per thread, a scalar one
variable every thread holds alike, a tensor a pointer parameter, a shared buffer or an
mbarrier an address. Inside a loop over the thread's chunks (`chunk_loop`) a row value
declared there holds one chunk. Each op is written by its rule (`emit_op`); the gpu.launch's
rule (kfc.codegen.row_launch) writes the row loop around its body.
"""

from __future__ import annotations

import contextlib

import attrs

from ..ir.core import Op, Value, walk_block
from ..ir.dtypes import DType, spoken
from ..ir.func import FuncOp
from ..ir.gpu_ops import LaunchOp
from ..ir import layouts
from ..ir.ptx_ops import LdOp
from ..ir.smem_ops import MbarrierAllocOp, SmemAllocOp, copies_not_indexed_by_row
from ..ir.tile_ops import BinaryOp, CastOp, ConstOp, DimOp, IndexDim, ReduceKind
from ..ir.types import MemSpace, SymDim, TensorType
from . import ptx, row_sums
from .c_names import C_TYPES, KernelParam, argument_params, as_float, c_extent, c_param, dim_params, from_float
from .errors import CodegenError
from .writer import CodeWriter
from .rules import in_cluster

# i32 reductions and scans: C integer arithmetic, wrapping as the interpreter's results do
INT_COMBINE = {ReduceKind.SUM: "({a} + {b})", ReduceKind.PROD: "({a} * {b})", ReduceKind.MAX: "max({a}, {b})",
               ReduceKind.MIN: "min({a}, {b})"}
INT_IDENTITY = {ReduceKind.SUM: "0", ReduceKind.PROD: "1", ReduceKind.MAX: "(-2147483647 - 1)",
                ReduceKind.MIN: "2147483647"}


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

    def describe(self) -> str:
        """The launch in a line, for `kfc compile`'s summary."""
        return (f"{self.block} threads/CTA, {self.rows_per_cta} row(s)/CTA, cluster {self.cluster}"
                f"{', persistent' if self.persistent else ''}"
                f"{f', {self.smem_dynamic} B dynamic shared' if self.smem_dynamic else ''}"
                f"{f', {self.min_ctas_per_sm} CTAs an SM' if self.min_ctas_per_sm else ''}")


class KernelEmitter(CodeWriter):
    as_float = staticmethod(as_float)
    from_float = staticmethod(from_float)

    def __init__(self, func: FuncOp, kernel_name: str) -> None:
        self.func = func
        self.kernel_name = kernel_name
        launches = [op for op in func.body.ops if isinstance(op, LaunchOp)]
        if len(launches) != 1:
            raise CodegenError(f"codegen needs one gpu.launch at the top of {func.sym_name}; run the tile pass",
                               func.loc, "use the default pipeline, or include tile{...} in -p")
        self.launch = launches[0]
        self.names: dict[Value, str] = {}
        self.int_constants: dict[Value, int] = {}
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.smem_decls: list[str] = []
        self.smem_bytes = 0
        self.cluster_ops: list[Op] = [op for op in self.launch.body.ops if in_cluster(op)]
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
        self.stage_bytes: dict[Value, int] = {}  # a staged buffer's or barrier's bytes per stage (all row slots)
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

    def generate(self) -> tuple[str, LaunchPlan]:
        params = self.params()
        sig = ", ".join(p.decl() for p in params)
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
                self.emit_op(op)
                if self.sums is not None:
                    break  # what follows uses the launch's sums: the second kernel's (row_sums)
                after_launch = True
                continue
            if after_launch and (op.has_trait("writes_memory") or op.has_trait("reads_memory")):
                raise CodegenError(f"{op.NAME} after the row loop: a row kernel reads and writes memory inside its "
                                   "loop only", op.loc, "move it into the parallel loop (a sum across rows is "
                                   "written out[:] += ... inside it)")
            self.emit_op(op)
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

    @property
    def sums_kernel_name(self) -> str:
        return f"{self.kernel_name}_sums"

    def params(self) -> list[KernelParam]:
        out = argument_params(self.func)
        if self.sums is not None:
            out.extend(row_sums.workspace_params(len(self.launch.results), self.N))
        return out + dim_params(self.func)

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

    def operand(self, v: Value, i):
        return self.elem(v, i) if i is not None else self.name(v)

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

    def _dim(self, d) -> str:
        if not isinstance(d, (int, SymDim)):
            raise CodegenError(f"bad dim {d}")
        return c_extent(d)

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

    def combine(self, kind: ReduceKind, a: str, b: str, dtype: DType = DType.F32) -> str:
        if dtype is DType.I32:
            return INT_COMBINE[kind].format(a=a, b=b)
        return {ReduceKind.SUM: f"({a} + {b})", ReduceKind.PROD: f"({a} * {b})",
                ReduceKind.MAX: ptx.max_nan(a, b), ReduceKind.MIN: ptx.min_nan(a, b)}[kind]

    @staticmethod
    def identity(kind: ReduceKind, dtype: DType = DType.F32) -> str:
        if dtype is DType.I32:
            return INT_IDENTITY[kind]
        return {ReduceKind.SUM: "0.0f", ReduceKind.PROD: "1.0f", ReduceKind.MAX: "__int_as_float(0xff800000)",
                ReduceKind.MIN: "__int_as_float(0x7f800000)"}[kind]

    def check_reducible(self, op) -> DType:
        """The dtype a row reduction runs in: f32, or i32 (exact, wrapping as the interpreter's)."""
        d = op.operands[0].ttype.dtype
        if d not in (DType.F32, DType.I32):
            kind = getattr(getattr(op, "kind", None), "value", "sum")
            what = "bools" if d.is_bool else f"{spoken(d)} values"
            if d.is_int:
                hint = f"reduce i32 values: write {kind}(i32(...)) around the row (exact while it fits in 32 bits)"
                if d is DType.INDEX:
                    hint += "; a dim, loop index or bare integer in the row made it i64, e.g. write i32(N) for N"
            else:
                hint = f"convert the row first, e.g. {kind}(i32(mask))" if d.is_bool else \
                    f"convert the row first, e.g. {kind}(f32(x))"
            raise CodegenError(f"{kind}(...) over a row of {what} cannot run on the GPU yet: "
                               "kfc reduces rows in f32 or i32", op.loc, hint)
        return d

