"""The tile emitter's loops inside one element or one phase (kfc.codegen.tile_emitter):
reductions and products as a loop in a lambda, accumulated in f32 (i64 for integers, bool for
logic), scans a thread a line, the triangular inverse a lane a row (a thread a column past a warp's
width)."""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.tile_ops import DotOp, ReduceKind, ReduceOp, ScanOp, TriInvOp
from ..ir.tile_ops.reductions import identity
from . import ptx
from .c_names import C_TYPES, as_float, from_float, literal
from .tile_plan import THREADS, WARP, reduced_count, strided_loop


class TileLoops:
    """Mixed into TileKernelEmitter: written through its elem, fresh, emit, new_buffer and
    phases."""

    @staticmethod
    def acc_type(d: DType) -> str:
        if d.is_bool:
            return "bool"
        if d.is_float:
            return "double" if d is DType.F64 else "float"
        return "long long"

    def combine(self, kind: ReduceKind, acc: str, x: str, ct: str) -> str:
        if kind in (ReduceKind.SUM, ReduceKind.MEAN):
            return f"{acc} + {x}"
        if kind is ReduceKind.PROD:
            return f"{acc} * {x}"
        if ct == "float":
            return ptx.max_nan(acc, x) if kind is ReduceKind.MAX else ptx.min_nan(acc, x)
        sym = ">" if kind is ReduceKind.MAX else "<"
        return f"(({acc}) {sym} ({x}) ? ({acc}) : ({x}))"

    def finish(self, text: str, ct: str, dst: DType) -> str:
        """An accumulator's value in the result's dtype."""
        if dst.is_float:
            return from_float(text, dst) if ct == "float" else f"({C_TYPES[dst]})({text})"
        return f"({C_TYPES[dst]})({text})"

    def reduce_expr(self, op: ReduceOp, idx) -> str:
        x = op.operands[0]
        d, shape = x.ttype.dtype, x.ttype.shape
        ct = self.acc_type(d)
        acc = self.fresh("kfc_a")
        outer = iter(idx or ())
        src, loops, count = [], [], 1
        for k, n in enumerate(shape):
            if k in op.axes:
                r = self.fresh("kfc_r")
                loops.append(f"for (int {r} = 0; {r} < {n}; ++{r}) ")
                src.append(r)
                count *= n
                if op.keepdims:
                    next(outer)
            else:
                src.append(next(outer))
        value = as_float(self.elem(x, tuple(src)), d) if ct == "float" else f"({ct})({self.elem(x, tuple(src))})"
        init = literal(identity(op.kind, d), DType.F32 if ct == "float" else d) if ct != "long long" else \
            f"(long long)({identity(op.kind, d)}LL)"
        result = f"{acc} / {count}.0f" if op.kind is ReduceKind.MEAN else acc
        return (f"[&]() {{ {ct} {acc} = {init}; {''.join(loops)}{acc} = {self.combine(op.kind, acc, value, ct)}; "
                f"return {self.finish(result, ct, op.result.ttype.dtype)}; }}()")

    def dot_expr(self, op: DotOp, idx) -> str:
        a, b = op.operands
        i, j = idx
        kk, acc = self.fresh("kfc_k"), self.fresh("kfc_a")
        n = a.ttype.shape[0 if op.trans_a else 1]
        ai = (kk, i) if op.trans_a else (i, kk)
        bi = (j, kk) if op.trans_b else (kk, j)
        d = a.ttype.dtype
        if d.is_int:
            return (f"[&]() {{ int {acc} = 0; for (int {kk} = 0; {kk} < {n}; ++{kk}) {acc} += (int)({self.elem(a, ai)}) "
                    f"* (int)({self.elem(b, bi)}); return {acc}; }}()")
        x, y = as_float(self.elem(a, ai), d), as_float(self.elem(b, bi), d)
        if op.precision == "tf32x3":  # three TF32 products a term, the small ones first, as on tensor cores
            xh, yh, xl, yl = (self.fresh("kfc_v") for _ in range(4))
            step = (f"const float {xh} = kfc_round_tf32({x}), {yh} = kfc_round_tf32({y}); "
                    f"const float {xl} = kfc_round_tf32({x} - {xh}), {yl} = kfc_round_tf32({y} - {yh}); "
                    + " ".join(f"{acc} = fmaf({p}, {q}, {acc});" for p, q in ((xl, yh), (xh, yl), (xh, yh))))
            return (f"[&]() {{ float {acc} = 0.0f; for (int {kk} = 0; {kk} < {n}; ++{kk}) {{ {step} }} "
                    f"return {acc}; }}()")
        if op.precision != "ieee":  # as tensor cores take them (a product the tile emitter keeps off them)
            x, y = f"kfc_round_{op.precision}({x})", f"kfc_round_{op.precision}({y})"
        return (f"[&]() {{ float {acc} = 0.0f; for (int {kk} = 0; {kk} < {n}; ++{kk}) {acc} = fmaf({x}, {y}, {acc}); "
                f"return {acc}; }}()")

    def emit_warp_reduce(self, op: ReduceOp, own_phase: bool = True, epilogue=None):
        """The reduction into a new buffer, a warp an output: its lanes stride over the reduced
        elements, then combine by shuffles, and lane 0 writes. The sums' order differs from a
        thread's loop by rounding only. In a phase of its own, else in the caller's. With
        epilogue = (tile, its elements' expression), lane 0 writes that tile, the expression
        reading the reduction's result where it reads the reduction (TilePhases)."""
        x, r = op.operands[0], op.result
        if epilogue:
            r_out, expr_of_idx = epilogue
        d, shape = x.ttype.dtype, x.ttype.shape
        ct = self.acc_type(d)
        kept = [n for k, n in enumerate(shape) if k not in op.axes]
        reduced = [n for k, n in enumerate(shape) if k in op.axes]
        outputs, count = r.ttype.numel(), reduced_count(op)
        buf = self.rounded_buffer(r_out) if epilogue else self.new_buffer(r)
        if own_phase:
            self.begin_phase()
        self.arena.touch(buf, self.step)
        o, j, acc, s = self.fresh("kfc_o"), self.fresh("kfc_l"), self.fresh("kfc_a"), self.fresh("kfc_x")
        init = literal(identity(op.kind, d), DType.F32 if ct == "float" else d) if ct != "long long" else \
            f"(long long)({identity(op.kind, d)}LL)"
        self.emit(strided_loop(o, f"threadIdx.x / {WARP}", outputs, THREADS // WARP))
        self.indent += 1
        outer = self.unflatten(o, kept) if kept else ()
        self.emit(f"{ct} {acc} = {init};")
        self.emit(f"for (int {j} = threadIdx.x % {WARP}; {j} < {count}; {j} += {WARP}) {{")
        self.indent += 1
        it_r, it_o = iter(self.unflatten(j, reduced)), iter(outer)
        src = tuple(next(it_r) if k in op.axes else next(it_o) for k in range(len(shape)))
        value = as_float(self.elem(x, src), d) if ct == "float" else f"({ct})({self.elem(x, src)})"
        self.emit(f"{acc} = {self.combine(op.kind, acc, value, ct)};")
        self.indent -= 1
        self.emit("}")
        other = f"__shfl_xor_sync(0xffffffffu, {acc}, {s})"
        self.emit(f"for (int {s} = {WARP // 2}; {s} > 0; {s} >>= 1) {acc} = {self.combine(op.kind, acc, other, ct)};")
        it_o = iter(outer)
        at = tuple("0" if k in op.axes else next(it_o) for k in range(len(shape))) if op.keepdims else outer
        result = f"{acc} / {count}.0f" if op.kind is ReduceKind.MEAN else acc
        value = self.finish(result, ct, r.ttype.dtype)
        if epilogue:
            self.inline[r] = lambda idx: value
            value = self.stored(buf, expr_of_idx(at))
            del self.inline[r]
        self.emit(f"if (threadIdx.x % {WARP} == 0) {buf.at(at)} = {value};")
        self.indent -= 1
        self.emit("}")
        if own_phase:
            self.end_phase(reopenable=True)
        self.buffers[r_out if epilogue else r] = buf
        return buf

    def emit_scan(self, op: ScanOp) -> None:
        """Each thread scans whole lines along the axis, in order."""
        x, r = op.operands[0], op.result
        shape, axis, d = x.ttype.shape, op.axis, x.ttype.dtype
        ct = self.acc_type(d)
        self.reopen_for(op.operands)
        buf = self.new_buffer(r)
        self.begin_phase()
        self.arena.touch(buf, self.step)
        others = [n for k, n in enumerate(shape) if k != axis]
        lines = 1
        for n in others:
            lines *= n

        def body(e):
            outer = iter(self.unflatten(e, others))
            s, acc = self.fresh("kfc_t"), self.fresh("kfc_a")
            pos = f"({shape[axis] - 1} - {s})" if op.reverse else s
            idx = tuple(pos if k == axis else next(outer) for k in range(len(shape)))
            init = literal(identity(op.kind, d), DType.F32 if ct == "float" else d)
            value = as_float(self.elem(x, idx), d) if ct == "float" else f"({ct})({self.elem(x, idx)})"
            out = buf.at(idx)
            step = f"{acc} = {self.combine(op.kind, acc, value, ct)};"
            write = f"{out} = {self.finish(acc, ct, r.ttype.dtype)};"
            self.emit(f"{ct} {acc} = {init};")
            self.emit(f"for (int {s} = 0; {s} < {shape[axis]}; ++{s}) {{ "
                      + (f"{write} {step}" if op.exclusive else f"{step} {write}") + " }")

        self.cta_loop(lines, body)
        self.end_phase(reopenable=True)
        self.buffers[r] = buf

    def emit_tri_inv(self, op: TriInvOp) -> None:
        """(I + tril(x, -1))^-1 by forward substitution: column c of the inverse needs only
        column c's earlier rows. Up to a warp's width of rows, a column a group of lanes, a lane
        a row (emit_tri_inv_by_lanes); else a thread a column."""
        x, r = op.operands[0], op.result
        n = x.ttype.shape[0]
        self.reopen_for(op.operands)
        buf = self.new_buffer(r)
        self.begin_phase()
        self.arena.touch(buf, self.step)
        if n <= WARP and self.tri_inv_lanes:
            self.emit_tri_inv_by_lanes(x, n, buf)
        else:
            def body(c):
                i, j, acc = self.fresh("kfc_t"), self.fresh("kfc_j"), self.fresh("kfc_a")
                self.emit(f"for (int {i} = 0; {i} < {n}; ++{i}) {{")
                self.emit(f"  float {acc} = {i} == {c} ? 1.0f : 0.0f;")
                self.emit(f"  for (int {j} = {c}; {j} < {i}; ++{j}) {acc} = fmaf(-({self.elem(x, (i, j))}), "
                          f"{buf.at((j, c))}, {acc});")
                self.emit(f"  {buf.at((i, c))} = {acc};")
                self.emit("}")

            self.cta_loop(n, body)
        self.end_phase(reopenable=True)
        self.buffers[r] = buf

    def emit_tri_inv_by_lanes(self, x, n: int, buf) -> None:
        """Every column at once: a group of `width` lanes (a power of two >= n) takes a column,
        lane i its row i. Row j is final once rows above it have been subtracted, so in step j
        it is passed to the lanes below by a shuffle and each subtracts its multiple: n - 1
        steps of one shuffle and one fma, no shared memory but x. The same fmas in the same
        order as a thread a column. Every lane of a warp runs the same steps (the shuffles need
        them all): the columns are rounded up to a multiple of the groups."""
        width = 1 << max(n - 1, 0).bit_length()
        groups = THREADS // width
        cols = -(-n // groups) * groups
        i, c, j = self.fresh("kfc_t"), self.fresh("kfc_c"), self.fresh("kfc_j")
        acc, xj = self.fresh("kfc_a"), self.fresh("kfc_x")
        self.emit(f"const int {i} = threadIdx.x % {width};")
        self.emit(strided_loop(c, f"threadIdx.x / {width}", cols, groups))
        self.emit(f"  float {acc} = {i} == {c} ? 1.0f : 0.0f;")
        self.emit("  #pragma unroll")
        self.emit(f"  for (int {j} = 0; {j} < {n - 1}; ++{j}) {{")
        self.emit(f"    const float {xj} = __shfl_sync(0xffffffffu, {acc}, {j}, {width});")
        self.emit(f"    if ({c} <= {j} && {j} < {i} && {i} < {n}) "
                  f"{acc} = fmaf(-({self.elem(x, (i, j))}), {xj}, {acc});")
        self.emit("  }")
        self.emit(f"  if ({c} < {n} && {i} < {n}) {buf.at((i, c))} = {acc};")
        self.emit("}")
