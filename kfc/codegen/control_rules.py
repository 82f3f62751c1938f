"""Row-kernel emission rules for sequential control flow inside a row: `tile.for` and `tile.if`.

A mixin of the row kernel emitter (kfc.codegen.cuda): the rules use its naming, declaration and
emission helpers.
"""

from __future__ import annotations

from ..ir.core import Value, walk_block
from ..ir.gpu_ops import ClusterMaxSumExpOp, ClusterReduceOp, CtaMaxSumExpOp, CtaReduceOp
from ..ir.tile_ops import ConstOp, ForOp, IfOp, ScanOp
from . import ptx
from .c_names import C_TYPES
from .errors import CodegenError

# the steps that exchange values through shared slots indexed by kfc_phase
SYNCED_STEPS = (CtaReduceOp, ClusterReduceOp, CtaMaxSumExpOp, ClusterMaxSumExpOp, ScanOp)


class ControlRules:
    """for and if: the body's ops emitted in place, carried values in variables."""

    def op_ForOp(self, op: ForOp) -> None:
        """for (k = lo; k < hi; k += step) over the body, its carried values in variables the
        body's arguments and the loop's results share. Every thread of the CTA runs every
        iteration (tile gives a CTA one row), so reductions in the body synchronise as they
        do in the row loop; their shared slots alternate per iteration with kfc_phase."""
        lo, hi, step = (self.name(v) for v in op.operands[:3])
        step_op = next((o for o in walk_block(self.launch.body) if o.results and o.results[0] is op.operands[2]),
                       None)
        if isinstance(step_op, ConstOp) and step_op.value <= 0:
            raise CodegenError(f"a for loop's step must be positive, not {step_op.value}", op.loc)
        body = op.body
        carried = []
        for init, arg, res in zip(op.inits, body.args[1:], op.results):
            n = self.declare(res)
            self.copy_value(n, res, init)
            self.names[arg] = n
            carried.append((n, res))
        k = self.fresh("kfc_k")
        self.names[body.args[0]] = k
        if not isinstance(step_op, ConstOp):
            self.emit(f"if ((long long)({step}) <= 0) __trap();  // a step the interpreter refuses: never loop forever")
        self.emit(f"for (long long {k} = (long long)({lo}); {k} < (long long)({hi}); {k} += (long long)({step})) {{")
        self.indent += 1
        for inner in body.ops[:-1]:
            self.emit_op(inner)
        # the next carried values, all read before any is written (one may feed another)
        nexts = []
        for (n, res), y in zip(carried, body.ops[-1].operands):
            t = self.fresh("kfc_next")
            self.emit_declare_like(t, res)
            self.copy_value(t, res, y)
            nexts.append((n, t, res))
        for n, t, res in nexts:
            if self.kind(res) == "row":
                self.loop(f"{n}[i] = {t}[i];")
            else:
                self.emit(f"{n} = {t};")
        # A step that synchronises the CTA through shared slots (at any depth of the body, in a
        # branch or an inner loop too) alternates its slots with kfc_phase from one iteration to
        # the next; after the loop a barrier ends every thread's reads of them, so whatever runs
        # next (the next row, the enclosing loop's next iteration) may write them in any phase.
        synced = any(isinstance(o, SYNCED_STEPS) for o in walk_block(body))
        if synced:
            self.emit("kfc_phase ^= 1;")
        self.indent -= 1
        self.emit("}")
        if synced:
            self.emit(ptx.bar_sync(0))

    def op_IfOp(self, op: IfOp) -> None:
        """if (c) { then } else { else }, each branch ending with the results' values. The
        condition is a scalar every thread of the row computes alike; where a branch holds a
        reduction, tile gives each CTA one row, so a CTA takes one branch as a whole."""
        results = [(self.declare(r), r) for r in op.results]
        for k, region in enumerate(op.regions):
            self.emit(f"if ({self.name(op.operands[0])}) {{" if k == 0 else "} else {")
            self.indent += 1
            for inner in region.ops[:-1]:
                self.emit_op(inner)
            for (n, r), y in zip(results, region.ops[-1].operands):
                self.copy_value(n, r, y)
            self.indent -= 1
        self.emit("}")

    def emit_declare_like(self, name: str, v: Value) -> None:
        ct = C_TYPES[v.ttype.dtype]
        self.emit(f"{ct} {name}[{self.EV}];" if self.kind(v) == "row" else f"{ct} {name};")

    def copy_value(self, name: str, like: Value, src: Value) -> None:
        if self.kind(like) == "row":
            self.loop(f"{name}[i] = {self.elem(src, 'i')};")
        else:
            self.emit(f"{name} = {self.name(src)};")
