"""The `.kfc` op definition to tile IR: names and scopes, literals, indexing and slicing, calls
to the builtins. Typing rules live in the IR builder; this module adds the source spans and the
language's own rules (what may be assigned where, what a slice may be)."""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable

import attrs
import lark

from ..diagnostics import KfcError, Span
from ..ir import constexpr
from ..ir.builder import ALL, Builder, BuildError, Slice
from ..ir.core import Value
from ..ir.dtypes import DTYPE_NAMES, DType, parse_dtype
from ..ir.func import FuncOp
from ..ir.tile_ops import StoreOp, broadcast_compatible
from ..ir.types import MemSpace, SymDim, TensorType
from ..ir.verifier import verify

KEYWORDS = {"op", "parallel", "for", "if", "else", "in", "step", "carry", "limit", "None", "true", "false",
            "check", "metric", "targets"}


def span_of(file: str, node) -> Span:
    if isinstance(node, lark.Token):
        return Span(file, node.line, node.column, node.end_line or node.line, node.end_column or node.column + 1)
    m = node.meta
    if getattr(m, "empty", True):
        return Span(file, 1, 1, 1, 2)
    return Span(file, m.line, m.column, m.end_line, m.end_column)


@attrs.define
class _Frame:
    """One scope. Loop bodies are frames whose assignments may not reach outer names."""

    kind: str  # "func" | "parallel" | "for"
    names: dict[str, Value] = attrs.Factory(dict)
    carried: tuple[str, ...] = ()
    assigned_at: dict[str, Span] = attrs.Factory(dict)
    indices: frozenset[str] = frozenset()  # the loop's index names: fixed for an iteration
    # a parallel loop's sums across its iterations: output name -> (contribution, statement)
    accumulated: dict[str, tuple[Value, Any]] = attrs.Factory(dict)


@attrs.frozen
class Tensor:
    """A function argument in global memory, as a name in scope."""

    value: Value


class Lowerer:
    def __init__(self, file: str, text: str, dtypes: dict[str, str] | None = None) -> None:
        self.file = file
        self.text = text
        self.requested_dtypes = dict(dtypes or {})
        self.type_vars: dict[str, DType] = {}      # T -> the dtype it is instantiated with
        self.type_params: list[tuple[str, tuple[str, ...]]] = []
        self.typed_params: dict[str, str] = {}     # parameter -> the type parameter its dtype is
        self.b = Builder()
        self.frames: list[_Frame] = []
        self.symbols: dict[str, Span] = {}
        self.params: dict[str, Value] = {}
        self.param_spans: dict[str, Span] = {}
        self.type_spans: dict[str, Span] = {}   # parameter -> where its type is written
        self.outputs: set[str] = set()
        # an output summed by += is written once, after its loop: where each was summed, and
        # where every other output was first read or stored
        self.summed: dict[str, Span] = {}
        self.touched: dict[str, Span] = {}

    # --- errors -------------------------------------------------------------------------------
    def span(self, node) -> Span:
        return span_of(self.file, node)

    def err(self, node, message: str, hint: str | None = None) -> KfcError:
        return KfcError(message, self.span(node), hint)

    # --- signature ----------------------------------------------------------------------------
    def dtype_named(self, name: str) -> DType | None:
        """A dtype name, or a type parameter of the op bound to its dtype."""
        return self.type_vars.get(name) or parse_dtype(name)

    def bind_type_params(self, node) -> None:
        """`op f<T: bf16 | f16>(...)`: T takes the requested dtype, else the first listed."""
        if node is None:
            unknown = sorted(self.requested_dtypes)
            if unknown:
                raise KfcError(f"the op has no type parameter {unknown[0]}", None,
                               "declare one, e.g. op f<T: bf16 | f16>(x: T[N]) -> (y: T[N])")
            return
        for tp in node.children:
            name, *options = tp.children
            n = str(name)
            if n in self.type_vars:
                raise self.err(name, f"type parameter {n} is declared twice")
            if parse_dtype(n) is not None:
                raise self.err(name, f"'{n}' is a dtype; a type parameter needs another name, e.g. T")
            opts = []
            for o in options:
                if parse_dtype(str(o)) is None:
                    raise self.err(o, f"unknown dtype '{o}' for type parameter {n}",
                                   f"dtypes are {', '.join(DTYPE_NAMES)}")
                opts.append(str(o))
            want = self.requested_dtypes.get(n, opts[0])
            if want not in opts:
                raise KfcError(f"type parameter {n} takes {' | '.join(opts)}, not {want}", self.span(tp),
                               f"choose one of {', '.join(opts)}")
            self.type_vars[n] = parse_dtype(want)
            self.type_params.append((n, tuple(opts)))
        unknown = sorted(set(self.requested_dtypes) - set(self.type_vars))
        if unknown:
            raise KfcError(f"the op has no type parameter {unknown[0]}", self.span(node),
                           f"its type parameters are {', '.join(self.type_vars)}")

    def lower_op(self, node) -> FuncOp:
        name_tok, tparams, ins_node, outs_node, body = node.children
        self.bind_type_params(tparams)
        ins = [p for p in ins_node.children if p is not None]
        outs = [p for p in outs_node.children if p is not None]
        inputs, outputs, defaults = [], [], {}
        seen: dict[str, lark.Token] = {}
        for p, is_out in [(p, False) for p in ins] + [(p, True) for p in outs]:
            pname, tspec, default = p.children
            if str(pname) in seen:
                raise self.err(pname, f"parameter {pname!s} is declared twice",
                               "give each input and output its own name")
            seen[str(pname)] = pname
            t = self.param_type(tspec, is_out, str(pname))
            if str(tspec.children[0]) in self.type_vars:
                self.typed_params[str(pname)] = str(tspec.children[0])
            if is_out:
                if default is not None:
                    raise self.err(default, f"output {pname!s} cannot have a default")
                if t.space is not MemSpace.GLOBAL:
                    raise self.err(tspec, f"output {pname!s} must be a tensor with a shape, not a scalar",
                                   f"give it dims, e.g. {pname}: {t.dtype}[M, N]")
                outputs.append((str(pname), t))
            else:
                inputs.append((str(pname), t))
                if default is not None:
                    if t.space is not MemSpace.REG:
                        raise self.err(default, f"tensor input {pname!s} cannot have a default",
                                       "make it optional with '?' instead: it then reads as zeros when absent")
                    defaults[str(pname)] = self.default_value(default)
                    dv = defaults[str(pname)]
                    if t.dtype.is_int and isinstance(dv, float) and not dv.is_integer():
                        raise self.err(default, f"the default of {pname} is {dv}, but {pname} is {t.dtype}",
                                       f"give an integer default, or declare {pname}: f32")
            self.param_spans[str(pname)] = self.span(p)
            self.type_spans[str(pname)] = self.span(tspec)
        for n in seen:
            if n in self.symbols:
                raise self.err(seen[n], f"{n} names both a parameter and a shape dimension",
                               "rename one of them")
        input_syms = {d.name for _, t in inputs for d in t.shape if isinstance(d, SymDim)}
        for n, t in outputs:
            missing = sorted(t.symbols - input_syms)
            if missing:
                raise KfcError(f"output {n} uses dimension {missing[0]}, which no input has",
                               self.param_spans[n], "outputs are sized from the inputs; give an input that dim")
        for n, value in defaults.items():
            if isinstance(value, str):
                unknown = constexpr.symbols_of(value) - set(self.symbols)
                if unknown:
                    raise KfcError(f"the default of {n} uses {sorted(unknown)[0]}, which is not a shape dimension",
                                   self.param_spans[n], "a default is a number or an expression of dims, e.g. K ** -0.5")
        if not outputs:
            raise self.err(outs_node if outs_node.children and outs_node.children[0] is not None else node,
                           f"op {name_tok} has no outputs", "declare what it writes after '->', e.g. -> (y: f32[N])")
        self.outputs = {n for n, _ in outputs}
        with self.b.at(self.span(node)):
            with self.b.func(str(name_tok), inputs, outputs, defaults, self.type_spans) as f:
                for v in f.args:
                    self.params[v.name] = v
                self.frames.append(_Frame("func"))
                self.block(body)
                self.frames.pop()
        func = f.op
        written = {op.operands[1].name for op in func.walk() if isinstance(op, StoreOp)}
        for n, t in outputs:
            if n not in written and not t.optional:
                raise KfcError(f"output {n} is never written", self.param_spans[n],
                               f"store into it, e.g. {n}[...] = ..., or assign the whole tensor with {n} = ...")
        return verify(func)

    def param_type(self, node, is_out: bool, pname: str = "x") -> TensorType:
        name_tok, dims_node, opt = node.children
        dtype = self.dtype_named(str(name_tok))
        if dtype is None:
            close = difflib.get_close_matches(str(name_tok), list(DTYPE_NAMES), 1, 0.5) \
                or [d for d in DTYPE_NAMES if d[0] == str(name_tok)[:1]]
            raise self.err(name_tok, f"unknown dtype '{name_tok}'",
                           (f"did you mean {close[0]}? " if close else "") + f"dtypes are {', '.join(DTYPE_NAMES)}")
        if dims_node is None:
            if opt is not None:
                raise self.err(opt, "a scalar cannot be optional",
                               f"drop the '?' and give it a default instead, e.g. {pname}: {name_tok} = 0")
            return TensorType(dtype)
        shape = []
        for d in dims_node.children:
            if d is None:
                continue
            if d.data == "lit_dim":
                n = int(d.children[0])
                if not 1 <= n <= MAX_DIM:
                    raise self.err(d, f"a dim of {_shorten(str(n))} is out of range", "dims are from 1 to 2**62")
                shape.append(n)
                continue
            sym = str(d.children[0])
            if sym in KEYWORDS or self.dtype_named(sym) is not None:
                raise self.err(d, f"'{sym}' cannot name a dimension")
            self.symbols.setdefault(sym, self.span(d))
            off = 0 if d.data == "sym_dim" else int(d.children[1]) * (1 if d.data == "add_dim" else -1)
            if abs(off) > MAX_DIM:
                raise self.err(d, f"the offset {_shorten(str(off))} is out of range", "dim offsets are at most 2**62")
            shape.append(SymDim(sym, off))
        return TensorType(dtype, tuple(shape), MemSpace.GLOBAL, optional=opt is not None)

    def default_value(self, node):
        """A number, or the source text of a constant expression over dims."""
        if node.data in ("int_lit", "float_lit"):
            return self.number(node)
        if node.data == "neg" and node.children[0].data in ("int_lit", "float_lit"):
            return -self.number(node.children[0])
        text = self.text[node.meta.start_pos:node.meta.end_pos]
        try:
            # evaluated at specialisation; try it now at typical sizes to catch 1 / 0 early
            constexpr.evaluate(text, {sym: 64 for sym in constexpr.symbols_of(text)})
        except constexpr.ConstExprError as e:
            raise self.err(node, str(e), "a default is a number or an expression of dims, e.g. K ** -0.5") from None
        return text

    def number(self, node):
        """A literal as a Python number (the checks of `_value`: 64-bit integers, finite floats)."""
        return self._value(node)

    # --- scopes -------------------------------------------------------------------------------
    def lookup(self, name: str, node):
        for frame in reversed(self.frames):
            if name in frame.names:
                return frame.names[name]
        if name in self.params:
            v = self.params[name]
            if name in self.outputs:
                self.touch(name, node)
            return Tensor(v) if v.ttype.space is not MemSpace.REG else v
        if name in self.symbols:
            with self.b.at(self.span(node)):
                return self.b.dim(name)
        hint = None
        known = [n for f in self.frames for n in f.names] + list(self.params) + list(self.symbols)
        close = [k for k in known if k.lower() == name.lower() or (len(name) > 2 and k.startswith(name[:3]))] \
            or difflib.get_close_matches(name, known, 1, 0.6)
        if close:
            hint = f"did you mean {close[0]}?"
        elif name in _BUILTINS:
            hint = f"{name} is a function; call it, e.g. {name}(...)"
        if hint is None:
            shown = list(dict.fromkeys(known))
            hint = "assign it before use" + (f"; in scope here: {', '.join(shown[:12])}" if shown else "") \
                + (", ..." if len(shown) > 12 else "")
        raise self.err(node, f"unknown name '{name}'", hint)

    def assign(self, name: str, value: Value, node) -> None:
        if name in self.params:
            if name in self.outputs:
                raise AssertionError("whole-tensor stores are handled by the caller")
            kind = "tensor" if self.params[name].ttype.space is not MemSpace.REG else "scalar"
            raise self.err(node, f"cannot assign to the input {kind} '{name}'; inputs are read-only",
                           "choose a new name for the value")
        if name in self.symbols:
            raise self.err(node, f"cannot assign to the dimension '{name}'",
                           "dimensions are fixed by the input shapes; choose a new name for the value")
        frame = self.frames[-1]
        if any(name in f.indices for f in self.frames):
            raise self.err(node, f"'{name}' is a loop index and cannot be assigned",
                           "choose a new name for the value")
        if name not in frame.names and frame.kind != "if":  # a branch may assign outer names: the if's results
            for outer in reversed(self.frames[:-1]):
                if name in outer.names:
                    if frame.kind == "for":
                        raise self.err(node, f"'{name}' is defined outside this loop and assigned inside it",
                                       f"to update it on every iteration, carry it: carry ({name})")
                    raise self.err(node, f"'{name}' is defined outside this parallel loop and cannot be "
                                         "reassigned inside it (iterations are independent)",
                                   "use a new name inside the loop")
        frame.names[name] = self.b.name_value(value, name)
        frame.assigned_at[name] = self.span(node)

    # --- statements ---------------------------------------------------------------------------
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
        if target.value.name not in self.outputs:
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
            names.append(str(name))
            with self.b.at(self.span(r)):
                bounds.append((self.index_value(lo, "lower bound"), self.index_value(hi, "upper bound")))
        with self.b.at(self.span(node)):
            with self.b.parallel_reduce(bounds, names) as loop:
                frame = _Frame("parallel", dict(zip(names, loop.ivs)), indices=frozenset(names))
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
            frame = _Frame("if")
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
                frame = _Frame("for", {str(name): loop.iv, **dict(zip(carry_names, loop.carried))},
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

    # --- expressions --------------------------------------------------------------------------
    def index_value(self, node, what: str):
        v = self.value(node)
        with self.b.at(self.span(node)):
            try:
                return v if isinstance(v, int) and not isinstance(v, bool) else self.b.as_index(v, what)
            except BuildError as e:
                raise KfcError(e.message, self.span(node), e.hint) from None

    def value(self, node) -> Value | int | float | bool:
        """Lower an expression. Python numbers stay numbers until they meet a value."""
        try:
            with self.b.at(self.span(node)):
                v = self._value(node)
        except BuildError as e:
            raise KfcError(e.message, e.span or self.span(node), e.hint) from None
        if isinstance(v, Tensor):
            with self.b.at(self.span(node)):
                return self.b.load(v.value, [ALL] * v.value.ttype.rank)
        return v

    def _value(self, node):
        kind = node.data if isinstance(node, lark.Tree) else None
        if kind == "int_lit":
            value = int(node.children[0])
            if value >= constexpr.INT_LIMIT:
                raise self.err(node, f"the integer {_shorten(str(node.children[0]))} does not fit in 64 bits",
                               "integers in kfc are at most 2**63 - 1; write a float (1e30) for a large number")
            return value
        if kind == "float_lit":
            value = float(node.children[0])
            if math.isinf(value):
                raise self.err(node, f"the literal {node.children[0]} is too large for any float type",
                               "write a finite number; f64 reaches about 1.8e308")
            return value
        if kind == "true_lit":
            return True
        if kind == "false_lit":
            return False
        if kind == "name":
            name = str(node.children[0])
            return self.lookup(name, node)
        if kind in _BINOPS:
            return self.binop(node)
        if kind in _CMPS:
            a, b = (self.value(c) for c in node.children)
            if _is_num(a) and _is_num(b):
                return bool(_CMP_PY[kind](a, b))
            with self.b.at(self.span(node)):
                return self.b.cmp(_CMPS[kind], a, b)
        if kind == "neg":
            a = self.value(node.children[0])
            if isinstance(a, bool):
                raise self.err(node, "'-' of a boolean", "use ~ to negate a condition")
            if _is_num(a):
                return -a
            return self.b.unary("neg", a)
        if kind == "invert":
            a = self.value(node.children[0])
            if isinstance(a, bool):
                return not a
            if _is_num(a):
                raise self.err(node, "~ applies to bool masks and integers, not to a literal number")
            return self.b.unary("not", a)
        if kind == "pow":
            return self.power(node)
        if kind == "call":
            return self.call(node)
        if kind == "subscript":
            return self.subscript(node)
        if kind == "attribute":
            base, attr = node.children
            if str(attr) != "T":
                raise self.err(attr, f"unknown attribute .{attr}", "the only attribute is .T (transpose)")
            v = self.value(base)
            if not isinstance(v, Value):
                raise self.err(node, ".T needs a tile")
            with self.b.at(self.span(node)):
                return self.b.transpose(v)
        if kind == "list_lit":
            raise self.err(node, "a list is only allowed as a shape or permutation argument",
                           "e.g. zeros([K, V]) or transpose(x, [1, 0])")
        raise self.err(node, f"unsupported expression ({kind})")

    def binop(self, node):
        """A chain `a + b - c ...` is a left spine of binary nodes: walked in a loop, so a flat
        sum of any length lowers without deep recursion."""
        spine = []
        while isinstance(node, lark.Tree) and node.data in _BINOPS:
            spine.append(node)
            node = node.children[0]
        acc = self.value(node)
        for step in reversed(spine):
            b = self.value(step.children[1])
            try:
                with self.b.at(self.span(step)):
                    acc = self.binop_of(step, acc, b)
            except BuildError as e:
                raise KfcError(e.message, e.span or self.span(step), e.hint) from None
        return acc

    def binop_of(self, node, a, b):
        kind = node.data
        if _is_num(a) and _is_num(b):
            if kind == "truediv" and isinstance(a, int) and isinstance(b, int):
                raise self.err(node, "'/' of two integers", "use // for integer division")
            try:
                return constexpr.checked(_BINOP_PY[kind](a, b))
            except ZeroDivisionError:
                raise self.err(node, "division by zero in a constant") from None
            except OverflowError:
                raise self.err(node, "this constant does not fit in 64 bits (or overflows a float)") from None
        fn = _BINOPS[kind]
        if kind in ("truediv", "floordiv"):
            dts = [x.ttype.dtype for x in (a, b) if isinstance(x, Value)]
            is_int = all(d.is_int for d in dts) and not any(isinstance(x, float) for x in (a, b))
            if kind == "truediv" and is_int:
                raise self.err(node, "'/' of integers", "use // for integer (floor) division, or convert with f32(...)")
            if kind == "floordiv" and not is_int:
                raise self.err(node, "'//' is integer division; these operands are floating point",
                               "use / for floating-point division")
        with self.b.at(self.span(node)):
            return self.b.binary(fn, a, b)

    def power(self, node):
        base, exp = node.children
        a = self.value(base)
        e = self.value(exp)
        if _is_num(a) and _is_num(e):
            try:
                return constexpr.power(a, e)
            except (OverflowError, ValueError) as err:
                raise self.err(node, f"this constant cannot be computed: {err}") from None
            except ZeroDivisionError:
                raise self.err(node, "0 to a negative power in a constant") from None
        with self.b.at(self.span(node)):
            if _is_num(e):
                # exact and cheaper forms for the exponents people write
                if e == 1:
                    return a
                if e == 2:
                    return self.b.binary("mul", a, a)
                if e == 0.5:
                    return self.b.unary("sqrt", a)
                if e == -0.5:
                    return self.b.unary("rsqrt", a)
            return self.b.binary("pow", a, e)

    # --- indexing -----------------------------------------------------------------------------
    def subscript(self, node):
        base, index = node.children
        if isinstance(base, lark.Tree) and base.data == "name":
            target = self.lookup(str(base.children[0]), base)
        else:
            target = self.value(base)
        if isinstance(target, Tensor):
            # None adds an axis to what the rest of the index loads (rstd[:, None] is [M, 1])
            kept = [c for c in index.children if c.data != "idx_new"]
            axes = [sum(1 for c in index.children[:i] if c.data != "idx_point")
                    for i, c in enumerate(index.children) if c.data == "idx_new"]
            items = self.index_items(lark.Tree(index.data, kept, index.meta) if axes else index, target.value)
            with self.b.at(self.span(node)):
                tile = self.b.load(target.value, items)
                return self.b.expand_dims(tile, axes) if axes else tile
        if not isinstance(target, Value):
            raise self.err(node, "only tensors and tiles can be indexed")
        # tiles: ':' keeps a dim, None inserts one
        axes, pos = [], 0
        for i, item in enumerate(index.children):
            if item.data == "idx_new":
                axes.append(i)
            elif item.data == "idx_slice" and all(c is None for c in item.children):
                pos += 1
            elif target.ttype.rank == 0:
                raise self.err(item, f"cannot index the scalar '{target.name or 'value'}'",
                               "a scalar has no dims; use it as it is (it broadcasts)")
            else:
                raise self.err(item, "a tile can only be indexed with ':' and None",
                               "to pick elements use where(...) with a mask; to pick a row of a tensor index the tensor")
        if pos + len(axes) != len(index.children) or pos > target.ttype.rank:
            raise self.err(index, f"too many ':' for a rank-{target.ttype.rank} tile")
        if not axes:
            return target
        with self.b.at(self.span(node)):
            return self.b.expand_dims(target, axes)

    def index_items(self, index, tensor: Value) -> list:
        items = []
        rank = tensor.ttype.rank
        if len(index.children) > rank:
            raise self.err(index, f"{len(index.children)} indices for '{tensor.name}', which has {rank} dims "
                                  f"({tensor.type})",
                           f"give at most one index per dim, e.g. {tensor.name}[{', '.join([':'] * rank)}]")
        for dim, item in enumerate(index.children):
            if item.data == "idx_point":
                v = self.index_value(item.children[0], "index")
                if isinstance(v, int) and v < 0:
                    raise self.err(item, f"negative index {v}: kfc indexes from 0 and does not count from the end",
                                   f"write the position from the start, e.g. {tensor.name}[..., N - 1] for the last")
                items.append(v)
                continue
            lo, hi, limit = item.children
            if lo is None and hi is None:
                if limit is not None:
                    raise self.err(item, "'limit' needs a sized slice",
                                   "write lo:lo+SIZE limit END, e.g. t:t+64 limit eos; a plain ':' needs no limit")
                items.append(ALL)
                continue
            if hi is None:
                raise self.err(item, "an open-ended slice 'lo:' has no compile-time size",
                               "write lo:lo+SIZE (with 'limit' for a partial tile), or ':' for the whole dim")
            size = self.slice_size(lo, hi, item)
            start = self.index_value(lo, "slice start") if lo is not None else 0
            lim = self.index_value(limit, "slice limit") if limit is not None else None
            items.append(Slice(start, size, lim))
        return items

    def slice_size(self, lo, hi, node) -> int:
        a = _affine(lo) if lo is not None else ({}, 0)
        b = _affine(hi)
        if a is None or b is None:
            raise self.err(node, "the slice's size must be a compile-time constant",
                           "write it as lo:lo+SIZE, e.g. t:t+64 (add 'limit eos' for a partial tile)")
        terms = {k: b[0].get(k, 0) - a[0].get(k, 0) for k in set(a[0]) | set(b[0])}
        if any(terms.values()):
            raise self.err(node, "the slice's size must be a compile-time constant",
                           "write it as lo:lo+SIZE, e.g. t:t+64 (add 'limit eos' for a partial tile)")
        size = b[1] - a[1]
        if size <= 0:
            raise self.err(node, f"the slice is empty or reversed (size {size})")
        return size

    # --- calls --------------------------------------------------------------------------------
    def call(self, node):
        fname, args_node = node.children
        name = str(fname)
        args = [a for a in (args_node.children if args_node is not None else [])]
        positional = [a for a in args if not (isinstance(a, lark.Tree) and a.data == "kwarg")]
        kwargs = {}
        for a in args:
            if isinstance(a, lark.Tree) and a.data == "kwarg":
                key = str(a.children[0])
                if key in kwargs:
                    raise self.err(a, f"argument '{key}' is given twice")
                kwargs[key] = a.children[1]
        if args and any(isinstance(a, lark.Tree) and a.data == "kwarg" for a in args[:len(positional)]) \
                and positional and args.index(positional[-1]) > min(
                    i for i, a in enumerate(args) if isinstance(a, lark.Tree) and a.data == "kwarg"):
            raise self.err(node, "positional argument after a keyword argument",
                           f"put the positional arguments first, e.g. {_SIGNATURES.get(name, name + '(x, k=...)')}")
        dtype = self.dtype_named(name)
        if dtype is not None:
            if kwargs or len(positional) != 1:
                raise self.err(node, f"{name}(...) converts one value; got {len(positional)} argument(s)"
                                     + (" and keywords" if kwargs else ""))
            v = self.value(positional[0])
            with self.b.at(self.span(node)):
                if _is_num(v):
                    return self.b.const(v, dtype)
                if not isinstance(v, Value):
                    raise self.err(node, f"{name}(...) needs a value")
                return self.b.cast(v, dtype)
        spec = _BUILTINS.get(name)
        if spec is None:
            close = ([b for b in _BUILTINS if b.startswith(name[:3])] if len(name) >= 3 else []) \
                or difflib.get_close_matches(name, list(_BUILTINS), 1, 0.6)
            raise self.err(fname, f"unknown function '{name}'",
                           f"did you mean {close[0]}?" if close else "see the language reference in README.md for the builtins")
        handler, params, min_pos, max_pos = spec
        if not min_pos <= len(positional) <= max_pos:
            want = str(min_pos) if min_pos == max_pos else f"{min_pos} to {max_pos}"
            want += " positional argument" + ("" if max_pos == 1 else "s")
            raise self.err(node, f"{name} takes {want}, got {len(positional)}",
                           f"call it as {_SIGNATURES[name]}" if name in _SIGNATURES else None)
        for k in kwargs:
            if k not in params:
                close = difflib.get_close_matches(k, params, 1, 0.6)
                raise self.err(args[[i for i, a in enumerate(args) if isinstance(a, lark.Tree) and a.data == 'kwarg'
                                     and str(a.children[0]) == k][0]],
                               f"{name} has no argument '{k}'",
                               (f"did you mean {close[0]}? " if close else "")
                               + (f"{name} takes {', '.join(params)}" if params else f"{name} takes no keywords"))
        with self.b.at(self.span(node)):
            return handler(self, node, positional, kwargs)

    # helpers for builtins
    def const_int(self, node, what: str) -> int:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(node, f"{what} must be a constant integer")
        return v

    def const_bool(self, node, what: str) -> bool:
        v = self.value(node)
        if not isinstance(v, bool):
            raise self.err(node, f"{what} must be true or false")
        return v

    def const_axes(self, node, what: str):
        if isinstance(node, lark.Tree) and node.data == "list_lit":
            return [self.const_int(c, what) for c in node.children if c is not None]
        return self.const_int(node, what)

    def tile_value(self, node, what: str) -> Value:
        v = self.value(node)
        if not isinstance(v, Value):
            raise self.err(node, f"{what} must be a tile, not the constant {v!r}")
        return v

    def shape_arg(self, node):
        if not (isinstance(node, lark.Tree) and node.data == "list_lit"):
            raise self.err(node, "a shape is a list of sizes, e.g. [64, K]")
        dims = []
        for c in node.children:
            if c is None:
                continue
            if isinstance(c, lark.Tree) and c.data == "name" and str(c.children[0]) in self.symbols:
                dims.append(SymDim(str(c.children[0])))
            else:
                n = self.const_int(c, "a shape entry")
                if n <= 0:
                    raise self.err(c, f"a shape entry must be positive, not {n}")
                dims.append(n)
        return dims

    def dtype_arg(self, node) -> DType:
        if isinstance(node, lark.Tree) and node.data == "name":
            d = self.dtype_named(str(node.children[0]))
            if d is not None:
                return d
        raise self.err(node, "dtype= takes a dtype name", f"one of {', '.join(DTYPE_NAMES)}")


MAX_DIM = 2**62


def _shorten(text: str) -> str:
    return text if len(text) <= 30 else text[:27] + "..."


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, Value)


def _affine(node):
    """An expression as ({atom: coefficient}, constant), or None when it is not linear.
    Atoms are names; anything else non-constant makes it non-affine. A chain of + and - is
    walked in a loop (its length is unbounded)."""
    if not isinstance(node, lark.Tree):
        return None
    if node.data in ("add", "sub"):
        spine = []
        while isinstance(node, lark.Tree) and node.data in ("add", "sub"):
            spine.append(node)
            node = node.children[0]
        acc = _affine(node)
        for step in reversed(spine):
            b = _affine(step.children[1])
            if acc is None or b is None:
                return None
            sign = 1 if step.data == "add" else -1
            terms = dict(acc[0])
            for k, v in b[0].items():
                terms[k] = terms.get(k, 0) + sign * v
            acc = (terms, acc[1] + sign * b[1])
        return acc
    if node.data == "int_lit":
        return {}, int(node.children[0])
    if node.data == "name":
        return {str(node.children[0]): 1}, 0
    if node.data == "mul":
        a, b = _affine(node.children[0]), _affine(node.children[1])
        if a is None or b is None:
            return None
        if not a[0]:
            return {k: a[1] * v for k, v in b[0].items()}, a[1] * b[1]
        if not b[0]:
            return {k: b[1] * v for k, v in a[0].items()}, a[1] * b[1]
        return None
    if node.data == "neg":
        a = _affine(node.children[0])
        return None if a is None else ({k: -v for k, v in a[0].items()}, -a[1])
    # an opaque subexpression (a load, a call) counts as one atom, keyed by its structure
    return {_tree_key(node): 1}, 0


def _tree_key(node) -> str:
    """The structure of a parse tree as text (built in a loop: equal subtrees, equal keys)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, lark.Tree):
            out.append(f"({n.data}")
            stack.append(")")
            stack.extend(reversed(n.children))
        elif n is None:
            out.append(" _")
        elif isinstance(n, str) and n == ")" and not isinstance(n, lark.Token):
            out.append(")")
        else:
            out.append(f" {n.type}:{n}" if isinstance(n, lark.Token) else f" {n}")
    return "".join(out)


_BINOPS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "div", "mod": "rem",
           "and_": "and", "or_": "or"}
# the left-associative chains the lowering walks in a loop (they do not count as nesting)
NESTING_CHAINS = frozenset(_BINOPS)
_BINOP_PY: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "and_": lambda a, b: a & b, "or_": lambda a, b: a | b,
}
_CMPS = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne"}
_CMP_PY = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


# --- builtins: name -> (handler, keyword names, min positional, max positional) ----------------

def _unary(fn):
    def h(lw: Lowerer, node, pos, kw):
        v = lw.value(pos[0])
        if _is_num(v):
            v = lw.b.literal(float(v) if not isinstance(v, bool) else v, None)
        return lw.b.unary(fn, v)
    return h


def _minmax(fn):
    def h(lw: Lowerer, node, pos, kw):
        if len(pos) == 2:
            if kw:
                raise lw.err(node, f"{fn}(a, b) is elementwise and takes no keywords",
                             f"for a reduction write {fn}(x, axis=...)")
            return lw.b.binary(fn, lw.value(pos[0]), lw.value(pos[1]))
        return _reduce(fn)(lw, node, pos, kw)
    return h


def _reduce(kind):
    def h(lw: Lowerer, node, pos, kw):
        x = lw.tile_value(pos[0], f"{kind}'s operand")
        axis = lw.const_axes(kw["axis"], "axis") if "axis" in kw else None
        keep = lw.const_bool(kw["keepdims"], "keepdims") if "keepdims" in kw else False
        return lw.b.reduce(kind, x, axis, keep)
    return h


def _scan(kind: str):
    """cumsum, cumprod, cummax, cummin: a prefix reduction along an axis."""
    def h(lw: Lowerer, node, pos, kw):
        x = lw.tile_value(pos[0], f"cum{kind}'s operand")
        axis = lw.const_int(kw["axis"], "axis") if "axis" in kw else 0
        excl = lw.const_bool(kw["exclusive"], "exclusive") if "exclusive" in kw else False
        rev = lw.const_bool(kw["reverse"], "reverse") if "reverse" in kw else False
        return lw.b.scan(kind, x, axis, excl, rev)
    return h


def _where(lw: Lowerer, node, pos, kw):
    c, a, b = (lw.value(p) for p in pos)
    return lw.b.where(c, a, b)


def _dot(lw: Lowerer, node, pos, kw):
    a = lw.tile_value(pos[0], "dot's lhs")
    b = lw.tile_value(pos[1], "dot's rhs")
    ta = lw.const_bool(kw["trans_a"], "trans_a") if "trans_a" in kw else False
    tb = lw.const_bool(kw["trans_b"], "trans_b") if "trans_b" in kw else False
    return lw.b.dot(a, b, ta, tb)


def _iota(lw: Lowerer, node, pos, kw):
    arg = pos[0]
    if isinstance(arg, lark.Tree) and arg.data == "name" and str(arg.children[0]) in lw.symbols:
        n = SymDim(str(arg.children[0]))  # iota(N): the indices of a dim, sized when specialised
    else:
        n = lw.const_int(arg, "iota's length (a constant or a dim)")
        if n <= 0:
            raise lw.err(arg, f"iota needs a positive length, not {n}")
    dtype = lw.dtype_arg(kw["dtype"]) if "dtype" in kw else DType.I32
    if not dtype.is_int:
        raise lw.err(kw["dtype"], "iota makes integers", "convert afterwards, e.g. f32(iota(64))")
    return lw.b.iota(n, dtype)


def _tri(lower: bool):
    def h(lw: Lowerer, node, pos, kw):
        rows = lw.const_int(pos[0], "the row count")
        cols = lw.const_int(pos[1], "the column count") if len(pos) > 1 else rows
        k = lw.const_int(kw["k"], "k") if "k" in kw else 0
        if rows <= 0 or cols <= 0:
            raise lw.err(node, "a triangular mask needs positive sizes")
        return lw.b.tri(rows, cols, lower, k)
    return h


def _fill(value):
    def h(lw: Lowerer, node, pos, kw):
        shape = lw.shape_arg(pos[0])
        v = value
        if v is None:
            v = lw.value(pos[1])
            if not _is_num(v):
                raise lw.err(pos[1], "full's value must be a constant number")
        dtype = lw.dtype_arg(kw["dtype"]) if "dtype" in kw else (DType.BOOL if isinstance(v, bool) else DType.F32)
        return lw.b.const(v, dtype, shape)
    return h


def _transpose(lw: Lowerer, node, pos, kw):
    x = lw.tile_value(pos[0], "transpose's operand")
    perm = None
    if len(pos) > 1:
        perm = lw.const_axes(pos[1], "a permutation entry")
        if isinstance(perm, int):
            raise lw.err(pos[1], "the permutation is a list, e.g. [1, 0]")
    return lw.b.transpose(x, perm)


def _reshape(lw: Lowerer, node, pos, kw):
    x = lw.tile_value(pos[0], "reshape's operand")
    return lw.b.reshape(x, lw.shape_arg(pos[1]))


_BUILTINS: dict[str, tuple[Callable, tuple[str, ...], int, int]] = {
    **{fn: (_unary(fn), (), 1, 1) for fn in
       ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softplus", "tanh", "abs")},
    "max": (_minmax("max"), ("axis", "keepdims"), 1, 2),
    "min": (_minmax("min"), ("axis", "keepdims"), 1, 2),
    "sum": (_reduce("sum"), ("axis", "keepdims"), 1, 1),
    "mean": (_reduce("mean"), ("axis", "keepdims"), 1, 1),
    "prod": (_reduce("prod"), ("axis", "keepdims"), 1, 1),
    **{f"cum{k}": (_scan(k), ("axis", "exclusive", "reverse"), 1, 1) for k in ("sum", "prod", "max", "min")},
    "where": (_where, (), 3, 3),
    "dot": (_dot, ("trans_a", "trans_b"), 2, 2),
    "iota": (_iota, ("dtype",), 1, 1),
    "tril": (_tri(True), ("k",), 1, 2),
    "triu": (_tri(False), ("k",), 1, 2),
    "zeros": (_fill(0), ("dtype",), 1, 1),
    "ones": (_fill(1), ("dtype",), 1, 1),
    "full": (_fill(None), ("dtype",), 2, 2),
    "transpose": (_transpose, (), 1, 2),
    "reshape": (_reshape, (), 2, 2),
}

_SIGNATURES = {
    **{fn: f"{fn}(x)" for fn in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softplus", "tanh", "abs")},
    "max": "max(a, b) elementwise, or max(x, axis=..., keepdims=...) to reduce",
    "min": "min(a, b) elementwise, or min(x, axis=..., keepdims=...) to reduce",
    "sum": "sum(x, axis=..., keepdims=...)", "mean": "mean(x, axis=..., keepdims=...)",
    "prod": "prod(x, axis=..., keepdims=...)",
    **{f"cum{k}": f"cum{k}(x, axis=0, exclusive=false, reverse=false)" for k in ("sum", "prod", "max", "min")},
    "where": "where(cond, a, b)",
    "dot": "dot(a, b, trans_a=false, trans_b=false)", "iota": "iota(n, dtype=i32)",
    "tril": "tril(rows, cols=rows, k=0)", "triu": "triu(rows, cols=rows, k=0)",
    "zeros": "zeros([dims], dtype=f32)", "ones": "ones([dims], dtype=f32)",
    "full": "full([dims], value, dtype=f32)", "transpose": "transpose(x, [perm])",
    "reshape": "reshape(x, [dims])",
}

BUILTIN_NAMES = tuple(_BUILTINS)
