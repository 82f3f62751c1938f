"""Statements: assignments, stores into outputs, `+=` sums across a parallel loop, if/else,
parallel loops and for loops with carried values."""

from __future__ import annotations

from ..diagnostics import KfcError
from ..ir.builder import ALL, BuildError
from ..ir.core import Value
from ..ir.dtypes import DType
from ..ir.tile_ops import broadcast_compatible
from ..ir.types import MemSpace
from .scopes import Frame
from .values import Tensor


class StatementLowering:
    """One method per statement kind, `stmt_<rule>`, dispatched by `block`."""

    def block(self, node) -> None:
        for stmt in node.children:
            with self.b.at(self.span(stmt)):
                getattr(self, "stmt_" + stmt.data)(stmt)

    def touch(self, name: str, node) -> None:
        """A read or store of the output `name` other than by +=."""
        if name in self.summed:
            raise self.err(node, f"'{name}' is summed across a parallel loop by += at {self.summed[name].line}:"
                                 f"{self.summed[name].col}; it is written once, after the loop, and not read or "
                                 "stored anywhere else", "sum into it only, or use another output for the rest")
        self.touched.setdefault(name, self.span(node))

    def stmt_assign(self, node) -> None:
        name, expr = node.children
        if str(name) in self.outputs:
            self.touch(str(name), name)
            target = self.params[str(name)]
            value = self.value(expr)
            if isinstance(value, Value) and value.ttype.space is not MemSpace.REG:
                raise self.err(name, f"'{name}' is an output of the op; a scratch tensor needs a name of its own",
                               f"name it differently, e.g. {name}_scratch = scratch(...)")
            with self.b.at(self.span(node)):
                self.store(target, [ALL] * target.ttype.rank, value, node)
            return
        value = self.value(expr)
        if not isinstance(value, Value):
            with self.b.at(self.span(expr)):
                value = self.b.literal(value, None)
        self.assign(str(name), value, node)

    def stmt_store(self, node) -> None:
        name, index, expr = node.children
        target = self.lookup(str(name), name)
        if not isinstance(target, Tensor):
            raise self.err(name, f"'{name}' is not a tensor; only outputs can be stored into",
                           f"to name a value write {name} = ...")
        if target.value.name not in self.outputs and target.value.name in self.params:
            raise self.err(name, f"cannot store into the input '{name}'; inputs are read-only",
                           "declare the tensor among the outputs after '->'")
        items = self.index_items(index, target.value)
        value = self.value(expr)
        self.store(target.value, items, value, node)

    def store(self, target: Value, items, value, node) -> None:
        with self.b.at(self.span(node)):
            try:
                self.b.store(value, target, items)
            except BuildError as e:
                raise KfcError(e.message, self.span(node), e.hint) from None

    def stmt_parallel(self, node) -> None:
        *ranges, body = node.children
        bounds, names = [], []
        for r in ranges:
            name, lo, hi = r.children
            if str(name) in names:
                raise self.err(name, f"index '{name}' appears twice")
            names.append(self.new_index(name))
            with self.b.at(self.span(r)):
                bounds.append((self.index_value(lo, "lower bound"), self.index_value(hi, "upper bound")))
        with self.b.at(self.span(node)):
            with self.b.parallel_reduce(bounds, names) as loop:
                frame = Frame("parallel", dict(zip(names, loop.ivs)), indices=frozenset(names))
                self.frames.append(frame)
                self.block(body)
                self.frames.pop()
                sums = list(frame.accumulated.items())
                if sums:
                    loop.reduce(["sum"] * len(sums), [c for _, (c, _) in sums], [f"{n}_sum" for n, _ in sums],
                                self.span(sums[-1][1][1]))
        for (name, (_, stmt)), total in zip(sums, loop.results):
            target = self.params[name]
            dtype = target.ttype.dtype
            with self.b.at(self.span(stmt)):
                value = total if dtype is DType.F32 else self.b.cast(total, dtype)
            self.store(target, [ALL] * target.ttype.rank, value, stmt)

    def stmt_accumulate(self, node) -> None:
        """`out[:] += v` in a parallel loop: out is the sum of v over the loop's iterations (in
        f32, in an order the code generator fixes, the same on every run)."""
        name, index, expr = node.children
        frame = self.frames[-1]
        if frame.kind != "parallel":
            where = {"for": "inside a for loop", "if": "inside an if"}.get(frame.kind, "outside a parallel loop")
            raise self.err(node, f"'{name} +=' {where}: += sums a value across the iterations of the parallel loop "
                                 "whose body it is in", "carry the sum through a for loop (carry (...)) and add it "
                                 "to the output once, in the parallel loop's body" if frame.kind == "for" else
                                 f"write {name}[...] = ... to store a value")
        if str(name) not in self.outputs:
            self.lookup(str(name), name)  # an unknown name says so
            raise self.err(name, f"'{name}' is not an output; += sums into an output tensor",
                           "declare the tensor among the outputs after '->'")
        if str(name) in self.touched:
            at = self.touched[str(name)]
            raise self.err(name, f"'{name}' is read or stored at {at.line}:{at.col}; an output summed by += is "
                                 "written once, after its loop, and not used anywhere else",
                           "sum into it only, or use another output for the rest")
        if str(name) in self.summed and str(name) not in frame.accumulated:
            raise self.err(name, f"'{name}' is already summed by += in another parallel loop",
                           "sum into it in one loop")
        target = Tensor(self.params[str(name)])
        if not target.value.ttype.dtype.is_float:
            raise self.err(name, f"+= sums into a floating-point output; '{name}' is {target.value.ttype.dtype}",
                           f"declare {name} as f32")
        self.summed.setdefault(str(name), self.span(node))
        if index is not None:
            items = self.index_items(index, target.value)
            if any(item is not ALL for item in items):
                raise self.err(index, f"+= sums into the whole of '{name}': index it with ':' in every dim",
                               f"write {name}[{', '.join([':'] * target.value.ttype.rank)}] += ...")
        value = self.value(expr)
        if not isinstance(value, Value) or value.ttype.dtype is not DType.F32:
            got = "a number" if not isinstance(value, Value) else f"{value.ttype.dtype}"
            raise self.err(expr, f"+= sums f32 values, not {got}", "convert the value with f32(...)")
        want = tuple(target.value.ttype.shape)
        if value.ttype.shape != want:
            if not broadcast_compatible(value.ttype.shape, want):
                raise self.err(expr, f"+= adds a {list(value.ttype.shape)} value into '{name}', shaped {list(want)}",
                               "the summed value has the output's shape")
            with self.b.at(self.span(expr)):
                value = self.b.broadcast_to(value, want)
        if str(name) in frame.accumulated:
            with self.b.at(self.span(node)):
                value = self.b.binary("add", frame.accumulated[str(name)][0], value)
        frame.accumulated[str(name)] = (value, node)

    def stmt_if_stmt(self, node) -> None:
        """`if c { ... } else { ... }`: one branch runs. A name a branch assigns that is
        defined outside the if, or that both branches assign, takes the branch's value after
        it (the other branch keeps the outer value); names only one branch makes stay in it."""
        cond, then_block, else_block = node.children
        c = self.value(cond)
        if isinstance(c, bool):  # known while lowering: the branch that runs is all there is
            if (then_block if c else else_block) is not None:
                self.block(then_block if c else else_block)
            return
        if not isinstance(c, Value) or not (c.ttype.is_scalar and c.ttype.dtype is DType.BOOL):
            raise self.err(cond, f"an if's condition is a scalar bool, not {getattr(c, 'type', type(c).__name__)}",
                           "compare to make one, e.g. if n > 0 { ... }; for elementwise choices use where(c, a, b)")
        branches = []
        for block in (then_block, else_block):
            frame = Frame("if")
            self.frames.append(frame)
            with self.b.region() as ops:
                if block is not None:
                    self.block(block)
            self.frames.pop()
            branches.append((frame, ops))
        (then, then_ops), (other, else_ops) = branches
        outside = [n for n in dict.fromkeys([*then.names, *other.names])
                   if any(n in f.names for f in self.frames) or (n in then.names and n in other.names)]
        values = []
        for n in outside:
            a = then.names[n] if n in then.names else self.lookup(n, node)
            b = other.names[n] if n in other.names else self.lookup(n, node)
            if a.type != b.type:
                raise self.err(node, f"'{n}' is {a.type} after one branch and {b.type} after the other",
                               "give it the same dtype and shape in both, e.g. with a cast")
            values.append((a, b))
        with self.b.at(self.span(node)):
            try:
                results = self.b.if_(c, then_ops, [a for a, _ in values], else_ops, [b for _, b in values], outside)
            except BuildError as e:
                raise KfcError(e.message, self.span(cond), e.hint) from None
        for n, r in zip(outside, results):
            self.assign(n, r, node)

    def stmt_for_loop(self, node) -> None:
        name, lo, hi, step, carry, body = node.children
        self.new_index(name)
        lo_v = self.index_value(lo, "lower bound")
        hi_v = self.index_value(hi, "upper bound")
        step_v = self.index_value(step, "step") if step is not None else 1
        if isinstance(step_v, int) and step_v <= 0:
            raise self.err(step, f"the step must be positive, not {step_v}",
                           "loops count up; to walk backwards, loop up and index with hi - 1 - i")
        carry_names = [str(c) for c in carry.children] if carry is not None else []
        inits = []
        for tok in carry.children if carry is not None else []:
            if carry_names.count(str(tok)) > 1:
                raise self.err(tok, f"'{tok}' is carried twice")
            v = self.lookup(str(tok), tok)
            if not isinstance(v, Value) or v.ttype.space is not MemSpace.REG:
                raise self.err(tok, f"only values can be carried; '{tok}' is a tensor",
                               "load it into a value first, e.g. S = h0[n, :, :]")
            inits.append(v)
        with self.b.at(self.span(node)):
            with self.b.for_(lo_v, hi_v, step_v, inits, iv_name=str(name)) as loop:
                frame = Frame("for", {str(name): loop.iv, **dict(zip(carry_names, loop.carried))},
                               tuple(carry_names), indices=frozenset({str(name)}))
                self.frames.append(frame)
                self.block(body)
                self.frames.pop()
                yielded = [frame.names[n] for n in carry_names]
                for n, init, y in zip(carry_names, inits, yielded):
                    if init.type != y.type:
                        raise KfcError(f"carried value '{n}' changes type in the loop: {init.type} before, "
                                       f"{y.type} after an iteration", frame.assigned_at.get(n, self.span(node)),
                                       f"a carried value keeps its dtype and shape; convert back, e.g. "
                                       f"{n} = {init.ttype.dtype}(...)")
                loop.yield_(yielded, self.span(node))
        for n, r in zip(carry_names, loop.results):
            frame = self.frames[-1]
            owner = next(f for f in reversed(self.frames) if n in f.names)
            if owner is not frame:
                self.assign(n, r, node)
            else:
                frame.names[n] = r
