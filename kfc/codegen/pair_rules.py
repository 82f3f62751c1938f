"""Row-kernel emission rules for (max, sum of exp(x - max)) pairs: the thread, warp, CTA and
cluster steps of `tile.max_sumexp` (gpu.*_max_sumexp).

A mixin of the row kernel emitter (kfc.codegen.cuda).
"""

from __future__ import annotations

from ..ir.gpu_ops import ClusterMaxSumExpOp, CtaMaxSumExpOp, ThreadMaxSumExpOp, WarpMaxSumExpOp
from ..ir.tile_ops import ReduceKind
from . import ptx


class PairRules:
    """The steps of a (max, sum) pair reduction."""

    @staticmethod
    def exp_of_difference(op, a: str, b: str) -> str:
        if op.approx:
            return f"kfc_ex2_approx(({a} - {b}) * 1.4426950408889634f)"
        return f"expf({a} - {b})"

    def pair_combine(self, op, m: str, s: str, om: str, os_: str) -> None:
        """(m, s) ⊕= (om, os): the larger maximum, each sum rescaled to it; an exponent of a
        maximum of -inf is taken as 0, so lanes without elements add nothing."""
        self.emit(f"{{ const float nm = {ptx.max_nan(m, om)}; const float at = nm == __int_as_float(0xff800000) ? "
                  f"0.0f : nm; {s} = {s} * {self.exp_of_difference(op, m, 'at')} + {os_} * "
                  f"{self.exp_of_difference(op, om, 'at')}; {m} = nm; }}")

    def max_sumexp_chunk(self, op, reg: str, i: str) -> None:
        """One chunk of V elements into the thread's running pair: the chunk's maximum, the
        running sum rescaled to the new maximum once, then the chunk's exponentials added."""
        m, s = (self.name(r) for r in op.results)
        x = self.elem(op.operands[0], i)
        guard = "" if self.exact else f"if {self.row.register_in_row_c(reg, 'kfc_g', self.N)} "
        self.emit("{")
        self.indent += 1
        self.emit(f"float cm = {self.identity(ReduceKind.MAX)};")
        self.emit("#pragma unroll")
        self.emit(f"for (int {i} = 0; {i} < {self.V}; ++{i}) {{ {guard}{{ cm = {ptx.max_nan('cm', x)}; }} }}")
        self.emit(f"const float nm = {ptx.max_nan(m, 'cm')};")
        self.emit("const float at = nm == __int_as_float(0xff800000) ? 0.0f : nm;")
        self.emit(f"{s} = {m} == nm ? {s} : {s} * {self.exp_of_difference(op, m, 'at')};")
        self.emit("#pragma unroll")
        self.emit(f"for (int {i} = 0; {i} < {self.V}; ++{i}) {{ {guard}{{ {s} += "
                  f"{self.exp_of_difference(op, x, 'at')}; }} }}")
        self.emit(f"{m} = nm;")
        self.indent -= 1
        self.emit("}")

    def op_ThreadMaxSumExpOp(self, op: ThreadMaxSumExpOp) -> None:
        """The thread's whole share in registers: its maximum, then the sum against it."""
        m, s = (self.name(r) for r in op.results)
        x = self.elem(op.operands[0], "i")
        guard = "" if self.exact else f"if {self.row.register_in_row_c('i', 'kfc_g', self.N)} "
        self.emit(f"float {m} = {self.identity(ReduceKind.MAX)}, {s} = 0.0f;")
        self.emit("#pragma unroll")
        self.emit(f"for (int i = 0; i < {self.EV}; ++i) {{ {guard}{{ {m} = {ptx.max_nan(m, x)}; }} }}")
        at = self.fresh("kfc_at")
        self.emit(f"const float {at} = {m} == __int_as_float(0xff800000) ? 0.0f : {m};")
        self.emit("#pragma unroll")
        self.emit(f"for (int i = 0; i < {self.EV}; ++i) {{ {guard}{{ {s} += {self.exp_of_difference(op, x, at)}; }} }}")

    def op_WarpMaxSumExpOp(self, op: WarpMaxSumExpOp) -> None:
        m, s = (self.name(r) for r in op.results)
        self.emit(f"float {m} = {self.name(op.operands[0])}, {s} = {self.name(op.operands[1])};")
        k = op.width // 2
        while k >= 1:
            om, os_ = self.fresh("kfc_om"), self.fresh("kfc_os")
            self.emit(f"const float {om} = {ptx.shfl_bfly(m, k)}, {os_} = {ptx.shfl_bfly(s, k)};")
            self.pair_combine(op, m, s, om, os_)
            k //= 2

    def op_CtaMaxSumExpOp(self, op: CtaMaxSumExpOp) -> None:
        warps = self.T // 32
        k = self.fresh("kfc_red")
        self.smem_decls.append(f"__shared__ float {k}[2][{self.R}][2][{warps}];")
        self.smem_bytes += 2 * self.R * 2 * warps * 4
        xm, xs = (self.name(v) for v in op.operands)
        m, s = (self.name(r) for r in op.results)
        slot = f"{k}[kfc_phase][kfc_r]"
        self.emit(f"if (kfc_lane == 0) {{ {ptx.st_shared_f32(ptx.smem_addr(f'{slot}[0][kfc_t / 32]'), xm)} "
                  f"{ptx.st_shared_f32(ptx.smem_addr(f'{slot}[1][kfc_t / 32]'), xs)} }}")
        self.emit(ptx.bar_sync(0))
        self.emit(f"float {m} = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[0][0]'))}, "
                  f"{s} = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[1][0]'))};")
        self.emit("#pragma unroll")
        self.emit(f"for (int w = 1; w < {warps}; ++w) {{")
        self.indent += 1
        self.emit(f"const float om = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[0][w]'))}, "
                  f"os = {ptx.ld_shared_f32(ptx.smem_addr(f'{slot}[1][w]'))};")
        self.pair_combine(op, m, s, "om", "os")
        self.indent -= 1
        self.emit("}")

    def op_ClusterMaxSumExpOp(self, op: ClusterMaxSumExpOp) -> None:
        slot, C = self.cluster_exchange(op), self.C
        m, s = (self.name(r) for r in op.results)
        self.emit(f"float {m} = {slot}[0], {s} = {slot}[{C}];")
        self.emit("#pragma unroll")
        self.emit(f"for (int c = 1; c < {C}; ++c) {{")
        self.indent += 1
        self.emit(f"const float om = {slot}[c], os = {slot}[{C} + c];")
        self.pair_combine(op, m, s, "om", "os")
        self.indent -= 1
        self.emit("}")
