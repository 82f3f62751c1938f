"""The kernel emitter of tile programs: a gpu.grid of program ids, each a CTA.

A value's form comes from its type's layout (kfc.ir.layouts), as in the row emitter, so the
elementwise rules (kfc.codegen.elementwise_rules) serve both: a tile in a fragment layout
(#wgmma_acc) is a per-thread register array of `registers` elements (element i at the row and
column the layout's C expressions give for register i of thread kfc_tid), a scalar one variable
every thread holds alike, a global tensor a pointer parameter, a tensor map a `__grid_constant__`
parameter, staged shared tiles and mbarrier arrays a shared-memory address. The grid's rule
(kfc.codegen.mma_rules) names the program ids; every other op is written by its rule.
"""

from __future__ import annotations

import contextlib

import attrs

from ..ir.core import Op, Value
from ..ir.func import FuncOp
from ..ir import layouts
from ..ir.mma_ops import GridOp, StageFragmentOp, StoreTileOp, TensorMapOp
from ..ir.tile_ops import BinaryOp, CastOp, CmpOp, UnaryOp, WhereOp
from ..ir.types import MemSpace
from .c_names import C_TYPES, KernelParam, argument_params, as_float, c_param, dim_params, from_float
from .errors import CodegenError
from .writer import CodeWriter

SMEM_ALIGN = 1024  # a 128-byte swizzle's period: every staged tile starts on it
# ops whose rules read a fragment value register by register (em.elem), so that it may be
# written inline where they read it
FUSED_READERS = (UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, StoreTileOp, StageFragmentOp)
INLINE_REPEATED_CHARS = 400  # a value read more than once is inlined only while its expression is short


@attrs.frozen
class GridPlan:
    """The launch contract's entry of a grid kernel: one CTA per program id, the programs of an
    N-D grid numbered along x (the kernel decodes its raster order from blockIdx.x)."""

    kernel: str
    params: tuple[KernelParam, ...]
    programs: int | str  # a tile kernel's: an expression of the run-time dims
    block: int
    smem_static: int
    smem_dynamic: int
    cluster: int = 1
    persistent: bool = False
    min_ctas_per_sm: int = 1
    # a tile kernel's (kfc.codegen.tile_emitter), whose tiles live in shared memory: which of
    # them are live together where they take the most
    shared_tiles: str = ""
    # the columns of a loop's carried tile a tile kernel holds in registers (kfc.codegen.tile_columns)
    register_columns: int = 0
    # the kernels launched after this one, in order (a tile program's later loops: kfc.codegen.tile_kernels)
    later: tuple["GridPlan", ...] = ()

    @property
    def grid(self) -> tuple[str, str, str]:
        return (str(self.programs), "1", "1")

    def contract(self) -> dict:
        return {"name": self.kernel, "grid": list(self.grid), "block": [self.block, 1, 1],
                "cluster": [self.cluster, 1, 1], "smem_static_bytes": self.smem_static,
                "smem_dynamic_bytes": self.smem_dynamic, "persistent": self.persistent,
                "params": [p.contract() for p in self.params], "min_ctas_per_sm": self.min_ctas_per_sm}

    def contracts(self) -> list[dict]:
        return [self.contract(), *(p.contract() for p in self.later)]

    def describe(self) -> str:
        ctas = f"one wave of CTAs for {self.programs} tiles" if self.persistent else f"{self.programs} CTAs"
        return f"{ctas} of {self.block} threads, {self.smem_dynamic} B dynamic shared"


class GridKernelEmitter(CodeWriter):
    as_float = staticmethod(as_float)
    from_float = staticmethod(from_float)
    chunk_local = None  # no fused chunk loops in a grid kernel

    def __init__(self, func: FuncOp, kernel_name: str) -> None:
        self.func = func
        self.kernel_name = kernel_name
        grids = [op for op in func.body.ops if isinstance(op, GridOp)]
        if len(grids) != 1:
            raise CodegenError(f"codegen needs one gpu.grid at the top of {func.sym_name}", func.loc)
        self.launch = grids[0]
        self.names: dict[Value, str] = {v: c_param(v.name) for v in func.args}
        self.int_constants: dict[Value, int] = {}
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.smem_decls: list[str] = []
        self.smem_dynamic = 0
        self.smem_static = 0
        self.device_functions: dict[str, str] = {}
        self.single_thread = 0  # depth of gpu.single_thread regions around the op being written
        self.role = None  # the gpu.roles region the op being written is in (None: outside roles)
        # fragment values written where they are read, an expression of the register index:
        # no register array of their own beside the accumulator's (a bias read per use)
        self.inline: dict[Value, object] = {}  # defined once each at the top of the .cu
        self.locals = None  # inside register_locals: ({(value, index): local name}, their definitions)
        fragments = {layouts.of(r.ttype.layout).registers(r.ttype.shape[1]) for op in self.launch.walk()
                     for r in op.results if self._is_fragment(r)}
        if len(fragments) > 1:
            raise CodegenError("the tiles of a grid kernel share one fragment size", self.launch.loc)
        self.EV = fragments.pop() if fragments else 0
        self.uses: dict[Value, list[Op]] = {}
        for op in self.launch.walk():
            for v in op.operands:
                self.uses.setdefault(v, []).append(op)

    @staticmethod
    def _is_fragment(v: Value) -> bool:
        t = v.type
        return getattr(t, "layout", None) is not None and t.space is MemSpace.REG and \
            t.layout.kind in layouts.FRAGMENT_KINDS

    # --- what the rules write through ------------------------------------------------------------
    def kind(self, v: Value) -> str:
        t = v.ttype
        if t.space is not MemSpace.REG:
            return "tensor"
        if self._is_fragment(v):
            return "row"  # a per-thread register array, as a row value is: the elementwise rules loop over it
        if t.rank == 0:
            return "scalar"
        raise CodegenError(f"a rank-{t.rank} tile {t} without a fragment layout reached codegen", None,
                           "run accelerate-matmul")

    def elem(self, v: Value, i: str) -> str:
        if v in self.inline:
            expr = self.inline[v](i)
            if self.locals is None or len(self.uses.get(v, ())) < 2 or "(" not in expr:
                return expr
            names, lines = self.locals
            if (v, i) not in names:
                names[v, i] = self.fresh("kfc_r")
                lines.append(f"const {C_TYPES[v.ttype.dtype]} {names[v, i]} = {expr};")
            return names[v, i]
        return f"{self.name(v)}[{i}]" if self.kind(v) == "row" else self.name(v)

    @contextlib.contextmanager
    def register_locals(self):
        """While a store's loop body is written: an inlined value that more than one op reads
        becomes a local of the iteration, once per register index, in the lines yielded (for the
        rule to write before its store). Its text would otherwise repeat at every read, and the
        C compiler does not merge the repeated loads of a bias (GELU reads its argument four
        times)."""
        outer, self.locals = self.locals, ({}, [])
        try:
            yield self.locals[1]
        finally:
            self.locals = outer

    def operand(self, v: Value, i):
        return self.elem(v, i) if i is not None else self.name(v)

    @property
    def span(self) -> int:
        return self.EV

    def declare(self, v: Value) -> str:
        n = self.name(v)
        ct = C_TYPES[v.ttype.dtype]
        self.emit(f"{ct} {n}[{self.EV}];" if self.kind(v) == "row" else f"{ct} {n};")
        return n

    def assign(self, op: Op, expr_of_i) -> None:
        """An elementwise result read only by the elementwise ops and the store after it in the
        same block is written where it is read (once, or a short expression repeated at each
        read, which the C compiler computes once): an epilogue (bias, activation, cast) becomes
        one expression per register at the store, not an array of registers per step beside
        the accumulator's (which spilled at 168 registers)."""
        r = op.result
        readers = self.uses.get(r, [])
        # the chunks of a TMA-store epilogue read disjoint columns: each element once in all
        once = len(readers) == 1 or all(isinstance(u, StageFragmentOp) for u in readers)
        if self.kind(r) == "row" and self._read_in_place(r, op) and \
                (once or len(expr_of_i("i")) <= INLINE_REPEATED_CHARS):
            self.inline[r] = expr_of_i
            return
        block = self._block_of(op)
        defined_here = {res for o in block.ops for res in o.results} if block is not None else set()
        dying = next((v for v in op.operands if self.kind(v) == "row" and v not in self.inline and v in self.names
                      and v in defined_here and self.uses.get(v) == [op]
                      and C_TYPES[v.ttype.dtype] == C_TYPES[r.ttype.dtype]), None)
        if self.kind(r) == "row" and dying is not None:
            # an operand array defined in this block and read by this op alone takes the result
            # in place (register i reads only register i): the accumulator becomes acc + bias
            # without a second array (one defined outside a loop around op must keep its value)
            self.names[r] = self.names[dying]
            self.loop(f"{self.names[r]}[i] = {expr_of_i('i')};")
            return
        super().assign(op, expr_of_i)

    def _read_in_place(self, v: Value, op: Op) -> bool:
        """Whether every reader of v is an elementwise op or the store in op's own block."""
        users = self.uses.get(v, [])
        if not users or not all(isinstance(u, FUSED_READERS) for u in users):
            return False
        block = self._block_of(op)
        return block is not None and all(u in block.ops for u in users)

    def _block_of(self, op: Op):
        """The block of the launch that holds op."""
        return next((region for o in self.launch.walk() for region in o.regions if op in region.ops), None)

    def used_after(self, v: Value, op: Op) -> bool:
        """Whether anything but `op` reads v (a wgmma may then update its accumulator in place)."""
        return any(u is not op for u in self.uses.get(v, ()))

    def alloc_dynamic(self, nbytes: int) -> int:
        """A staged tile's offset in the kernel's dynamic shared memory."""
        offset = -(-self.smem_dynamic // SMEM_ALIGN) * SMEM_ALIGN
        self.smem_dynamic = offset + nbytes
        return offset

    # --- the kernel --------------------------------------------------------------------------
    def params(self) -> list[KernelParam]:
        outputs = set(self.func.outputs)
        maps = [KernelParam(op.operands[0].name, "tensor_map", "kfc_tensor_map", str(op.operands[0].ttype.dtype),
                            is_output=op.operands[0] in outputs, box=tuple(op.box), swizzle=op.swizzle)
                for op in self.launch.body.ops if isinstance(op, TensorMapOp)]
        return argument_params(self.func) + maps + dim_params(self.func)

    def generate(self) -> tuple[str, GridPlan]:
        params = self.params()
        sig = ", ".join(p.decl() for p in params)
        for op in self.func.body.ops:
            self.emit_op(op)
        if self.smem_dynamic:
            self.smem_dynamic += SMEM_ALIGN  # room to align the dynamic base up to the swizzle period
        body = "\n".join(self.lines)
        smem = "\n".join("  " + d for d in self.smem_decls)
        L = self.launch
        code = (f'extern "C" __global__ void __launch_bounds__({L.threads}, 1) {self.kernel_name}({sig}) {{\n'
                f"{smem}\n{body}\n}}\n")
        programs = 1
        for g in L.grid:
            programs *= g
        return code, GridPlan(self.kernel_name, tuple(params), programs, L.threads, self.smem_static,
                              self.smem_dynamic, cluster=L.cluster, persistent=L.persistent)

