"""Hypothesis strategies for the tile IR: random well-typed functions built with kfc.ir.Builder.

`programs()` draws a whole `kfc.func`: a random signature (literal dims, symbols, `N + 1` /
`N - 1` offsets, optional tensors, scalar params with numeric and string defaults) and a body
of parallel loops, nested `tile.for` loops with carried values, `tile.if` branches, loads and stores with every
kind of index entry, and a random mix of the tile ops. Every op goes through the Builder, so
what comes out is well typed by construction; the tests then check the verifier, printer,
parser and specialiser agree about it.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st

from kfc.ir import ALL, Builder, BuildError, Slice, SymDim, TensorType
from kfc.ir.dtypes import DType
from kfc.ir.tile_ops import BINARY_OPS, UNARY_OPS, kind_accepts
from kfc.ir.types import Layout, MemSpace

SYMBOLS = ["M", "N", "K"]
# Names chosen from a small set so that the printer has to make them unique with `.N`.
NAMES = [None, None, "x", "t", "acc", "S", "y"]
TENSOR_DTYPES = [DType.F32, DType.BF16, DType.F16, DType.F64, DType.I32, DType.I8, DType.I64, DType.BOOL]
FLOAT_DEFAULTS = [1e-06, 0.5, -2.25, 1e30, 3.0, math.inf, -math.inf, math.nan, 5e-324, 0.1]


class _Gen:
    """One program being drawn: the builder, the values in scope, the symbols declared."""

    def __init__(self, draw, symbols: list[str]) -> None:
        self.draw = draw
        self.b = Builder()
        self.symbols = symbols
        self.scopes: list[list] = [[]]
        self.index_values: list = []   # index scalars usable as points / bounds
        self.n_ops = 0

    # --- drawing helpers --------------------------------------------------------------------
    def pick(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def boolean(self) -> bool:
        return self.draw(st.booleans())

    def name(self):
        return self.pick(NAMES)

    def dim(self, allow_sym: bool = True):
        if allow_sym and self.symbols and self.boolean():
            sym = self.pick(self.symbols)
            return SymDim(sym, self.pick([0, 0, 1, -1, 2]))
        return self.draw(st.integers(1, 8))

    def pool(self) -> list:
        return [v for scope in self.scopes for v in scope]

    def add(self, v) -> None:
        self.scopes[-1].append(v)

    def tiles(self, pred=lambda t: True) -> list:
        return [v for v in self.pool() if pred(v.ttype)]

    # --- signature --------------------------------------------------------------------------
    def signature(self):
        inputs, outputs, defaults = [], [], {}
        n_in = self.draw(st.integers(1, 3))
        for i in range(n_in):
            dtype = self.pick(TENSOR_DTYPES)
            shape = [self.dim() for _ in range(self.draw(st.integers(1, 3)))]
            space = MemSpace.GLOBAL
            layout = None
            if self.draw(st.integers(0, 5)) == 0:
                space = MemSpace.SHARED
            if self.draw(st.integers(0, 5)) == 0:
                layout = Layout("blocked", (("order", tuple(range(len(shape)))[::-1]),
                                            ("warps", self.draw(st.integers(1, 8))),
                                            ("eps", self.pick(FLOAT_DEFAULTS))))
            inputs.append((f"in{i}", TensorType(dtype, tuple(shape), space, layout,
                                               optional=self.draw(st.integers(0, 3)) == 0)))
        # scalar params: numeric and string defaults
        if self.boolean():
            inputs.append(("eps", TensorType(DType.F32)))
            if self.boolean():
                defaults["eps"] = self.pick(FLOAT_DEFAULTS)
        if self.boolean():
            inputs.append(("k", TensorType(DType.I32)))
            if self.boolean():
                defaults["k"] = self.draw(st.integers(-1000, 1000))
        if self.symbols and self.boolean():
            inputs.append(("scale", TensorType(DType.F32)))
            sym = self.pick(self.symbols)
            defaults["scale"] = self.pick([f"{sym} ** -0.5", f"1.0 / sqrt({sym})", f"{sym} * 2 + 1"])
        for i in range(self.draw(st.integers(1, 2))):
            dtype = self.pick(TENSOR_DTYPES)
            shape = [self.dim() for _ in range(self.draw(st.integers(1, 3)))]
            outputs.append((f"out{i}", TensorType(dtype, tuple(shape), MemSpace.GLOBAL,
                                                  optional=self.draw(st.integers(0, 3)) == 0)))
        # every symbol must come from the signature; drop those that did not turn up
        used = {d.name for _, t in inputs + outputs for d in t.shape if isinstance(d, SymDim)}
        for name, value in list(defaults.items()):
            if isinstance(value, str) and not any(s in value for s in used):
                del defaults[name]
        self.symbols = [s for s in self.symbols if s in used]
        if "scale" in dict(inputs) and "scale" not in defaults:
            defaults["scale"] = 0.125
        return inputs, outputs, defaults

    # --- index operands ---------------------------------------------------------------------
    def index_operand(self):
        choices = ["lit"]
        if self.index_values:
            choices += ["iv", "iv"]
        if self.symbols:
            choices.append("dim")
        c = self.pick(choices)
        if c == "lit":
            return self.draw(st.integers(-3, 9))
        if c == "iv":
            return self.pick(self.index_values)
        v = self.b.dim(self.pick(self.symbols))
        if self.boolean():
            v = self.b.binary(self.pick(["sub", "add"]), v, self.draw(st.integers(0, 3)))
        return v

    def index_for(self, t: TensorType, allow_points: bool = True) -> list:
        items = []
        for _ in t.shape:
            kind = self.pick(["point", "all", "slice", "slice_limit"] if allow_points else ["all", "slice", "slice_limit"])
            if kind == "point":
                items.append(self.index_operand())
            elif kind == "all":
                items.append(ALL)
            else:
                size = self.draw(st.integers(1, 8))
                limit = self.index_operand() if kind == "slice_limit" else None
                items.append(Slice(self.index_operand(), size, limit))
        # sometimes leave trailing entries out: they mean ':'
        while items and items[-1] is ALL and self.boolean():
            items.pop()
        return items

    # --- ops ------------------------------------------------------------------------------------
    def load(self, tensors):
        t = self.pick(tensors)
        tt = t.ttype
        other = 0
        if tt.dtype.is_float:
            other = self.pick([0.0, -math.inf, math.inf, math.nan, 1e-06, -1.5])
        elif tt.dtype.is_int:
            other = self.draw(st.integers(-5, 5))
        else:
            other = self.boolean()
        v = self.b.load(t, self.index_for(tt), other=other, name=self.name())
        self.add(v)

    def cast_to(self, v, dtype):
        return self.b.cast(v, dtype, name=self.name())

    def op(self, tensors):
        b = self.b
        pool = self.pool()
        choices = ["load", "load", "load", "iota", "tri", "const"] if tensors else ["iota", "tri", "const"]
        if pool:
            choices += ["unary", "binary", "binary", "cast", "cmp_where", "shape", "reduce", "scan",
                        "dot", "lit_binary"]
        kind = self.pick(choices)
        self.n_ops += 1
        if kind == "load":
            self.load(tensors)
        elif kind == "iota":
            self.add(b.iota(self.draw(st.integers(1, 16)), self.pick([DType.I32, DType.I64, DType.INDEX, DType.I8])))
        elif kind == "tri":
            self.add(b.tri(self.draw(st.integers(1, 8)), self.draw(st.integers(1, 8)),
                           lower=self.boolean(), k=self.draw(st.integers(-3, 3))))
        elif kind == "const":
            dtype = self.pick([DType.F32, DType.BF16, DType.I32, DType.BOOL, DType.F16, DType.INDEX])
            shape = [self.dim() for _ in range(self.draw(st.integers(0, 2)))]
            if dtype.is_float:
                value = self.pick(FLOAT_DEFAULTS + [-0.0, 2.0, 1e-300])
            elif dtype.is_int:
                value = self.draw(st.integers(-(2**31), 2**31 - 1))
            else:
                value = self.boolean()
            self.add(b.const(value, dtype, shape, name=self.name()))
        elif kind == "unary":
            v = self.pick(pool)
            fns = [f for f, k in UNARY_OPS.items() if kind_accepts(k, v.ttype.dtype)]
            if fns:
                self.add(b.unary(self.pick(fns), v, name=self.name()))
        elif kind in ("binary", "lit_binary"):
            a = self.pick(pool)
            d = a.ttype.dtype
            fns = [f for f, k in BINARY_OPS.items() if kind_accepts(k, d)]
            if not fns:
                return
            fn = self.pick(fns)
            if kind == "lit_binary":
                if d.is_bool:
                    lit = self.boolean()
                elif d.is_float and self.boolean():
                    lit = self.pick([0.5, 1e-06, -2.0, math.inf])
                else:
                    lit = self.draw(st.integers(1, 7))
                args = [a, lit] if self.boolean() else [lit, a]
                self.add(b.binary(fn, *args, name=self.name()))
                return
            partners = [w for w in pool if self._broadcasts(a, w)]
            w = self.pick(partners)
            wd = w.ttype.dtype
            if not (d.is_int and wd.is_int) and wd != d:
                w = self.cast_to(w, d)
            try:
                self.add(b.binary(fn, a, w, name=self.name()))
            except BuildError:
                # int promotion can land on a dtype the op does not take; that is the builder's call
                pass
        elif kind == "cast":
            v = self.pick(pool)
            self.add(self.cast_to(v, self.pick([DType.F32, DType.BF16, DType.F16, DType.I32, DType.I8,
                                                DType.BOOL, DType.INDEX, DType.F64])))
        elif kind == "cmp_where":
            a = self.pick(pool)
            partners = [w for w in pool if self._broadcasts(a, w)]
            w = self.pick(partners)
            if w.ttype.dtype != a.ttype.dtype and not (w.ttype.dtype.is_int and a.ttype.dtype.is_int):
                w = self.cast_to(w, a.ttype.dtype)
            c = b.cmp(self.pick(["lt", "le", "gt", "ge", "eq", "ne"]), a, w, name=self.name())
            self.add(c)
            if self.boolean():
                x = self.pick([v for v in pool if self._broadcasts(c, v)])
                y = self.pick([v for v in pool if v.ttype.dtype == x.ttype.dtype and self._broadcasts(x, v)]
                              + [None])
                if y is None:
                    y = 1 if not x.ttype.dtype.is_bool else False
                    if x.ttype.dtype.is_float and self.boolean():
                        y = 0.0
                try:
                    self.add(b.where(c, x, y, name=self.name()))
                except BuildError:
                    pass
        elif kind == "shape":
            v = self.pick(pool)
            t = v.ttype
            op = self.pick(["expand", "transpose", "reshape", "broadcast"])
            if op == "expand":
                n = self.draw(st.integers(1, 2))
                rank = t.rank + n
                axes = self.draw(st.lists(st.integers(-rank, rank - 1), min_size=n, max_size=n,
                                          unique_by=lambda a: a % rank))
                self.add(b.expand_dims(v, axes, name=self.name()))
            elif op == "transpose" and t.rank >= 2:
                perm = self.draw(st.permutations(list(range(t.rank))))
                self.add(b.transpose(v, perm, name=self.name()))
            elif op == "reshape":
                if t.is_static and t.rank >= 1:
                    n = t.numel()
                    divs = [x for x in range(1, n + 1) if n % x == 0]
                    a = self.pick(divs)
                    shape = self.pick([[n], [a, n // a], [1, n], [a, 1, n // a]])
                else:
                    # a symbolic reshape may only add or drop size-1 dims
                    shape = [d for d in t.shape if d != 1]
                    for _ in range(self.draw(st.integers(0, 2))):
                        shape.insert(self.draw(st.integers(0, len(shape))), 1)
                self.add(b.reshape(v, shape, name=self.name()))
            elif op == "broadcast":
                shape = list(t.shape)
                shape = [self.dim() if d == 1 and self.boolean() else d for d in shape]
                shape = [self.dim() for _ in range(self.draw(st.integers(0, 1)))] + shape
                self.add(b.broadcast_to(v, shape))
        elif kind == "reduce":
            v = self.pick(self.tiles(lambda t: t.rank >= 1) or [None])
            if v is None:
                return
            t = v.ttype
            kinds = ["max", "min"]
            if not t.dtype.is_bool:
                kinds += ["sum", "prod"]
            if t.dtype.is_float:
                kinds.append("mean")
            axes = self.draw(st.one_of(st.none(), st.integers(-t.rank, t.rank - 1),
                                       st.lists(st.integers(0, t.rank - 1), min_size=1, unique=True)))
            self.add(b.reduce(self.pick(kinds), v, axes, keepdims=self.boolean(), name=self.name()))
        elif kind == "scan":
            v = self.pick(self.tiles(lambda t: t.rank >= 1) or [None])
            if v is None:
                return
            t = v.ttype
            self.add(b.scan(self.pick(["sum", "max", "min", "prod"]), v,
                            axis=self.draw(st.integers(-t.rank, t.rank - 1)),
                            exclusive=self.boolean(), reverse=self.boolean(), name=self.name()))
        elif kind == "dot":
            mats = self.tiles(lambda t: t.rank == 2)
            if not mats:
                v = self.pick(self.tiles(lambda t: t.rank == 1) or [None])
                if v is None:
                    return
                mats = [b.expand_dims(v, [self.pick([0, 1])])]
            a = self.pick(mats)
            # a dot takes bf16, f16, f32 and i8 operands (f64 is refused: it sums in f32)
            if not (a.ttype.dtype.is_float or a.ttype.dtype is DType.I8) or a.ttype.dtype is DType.F64:
                a = self.cast_to(a, self.pick([DType.BF16, DType.F32, DType.F16, DType.I8]))
            form = self.draw(st.integers(0, 4))
            if form == 0:
                r = b.dot(a, a, trans_b=True, name=self.name())
            elif form == 1:
                r = b.dot(a, a, trans_a=True, name=self.name())
            elif form == 2:
                r = b.dot(a, b.transpose(a), name=self.name())
            elif form == 3:
                at = b.transpose(a)
                r = b.dot(at, a, trans_a=True, trans_b=True, name=self.name())
            else:
                q = a.ttype.shape[1]
                others = [w for w in self.tiles(lambda t: t.rank == 2 and t.shape[0] == q)]
                w = self.pick(others or [None])
                if w is None:
                    return
                if w.ttype.dtype != a.ttype.dtype:
                    w = self.cast_to(w, a.ttype.dtype)
                r = b.dot(a, w, name=self.name())
            self.add(r)

    @staticmethod
    def _broadcasts(a, w) -> bool:
        sa, sw = a.ttype.shape, w.ttype.shape
        for x, y in zip(reversed(sa), reversed(sw)):
            if x != y and x != 1 and y != 1:
                return False
        return True

    def ops(self, tensors, lo: int, hi: int) -> None:
        for _ in range(self.draw(st.integers(lo, hi))):
            self.op(tensors)

    # --- structure --------------------------------------------------------------------------
    def store(self, outputs) -> None:
        if not outputs:
            return
        out = self.pick(outputs)
        ot = out.ttype
        index = self.index_for(ot)
        pool = self.pool()
        # the stored tile: a scalar (always broadcasts) or a value that fits the region
        from kfc.ir.tile_ops import IndexDim, indexed_shape

        dims = []
        for d, item in zip(ot.shape, index + [ALL] * (ot.rank - len(index))):
            dims.append(IndexDim("all") if item is ALL else
                        IndexDim("slice", item.size) if isinstance(item, Slice) else IndexDim("point"))
        region = indexed_shape(ot, tuple(dims))
        fits = [v for v in pool if len(v.ttype.shape) <= len(region)
                and all(x == y or x == 1 for x, y in zip(reversed(v.ttype.shape), reversed(region)))]
        if fits and self.boolean():
            v = self.pick(fits)
        elif pool and self.boolean():
            v = self.pick(pool)
            if v.ttype.rank:
                kinds = ["max", "min"] if v.ttype.dtype.is_bool else ["sum", "max"]
                v = self.b.reduce(self.pick(kinds), v)
        else:
            v = 1 if not ot.dtype.is_bool else True
            self.b.store(v, out, index)
            return
        self.b.store(self.b.cast(v, ot.dtype), out, index)

    def for_loop(self, tensors, outputs, depth: int) -> None:
        b = self.b
        lo = self.pick([0, self.draw(st.integers(-2, 4))] + self.index_values[-1:])
        hi = self.index_operand()
        step = self.pick([1, 2, 64] + ([b.dim(self.symbols[0])] if self.symbols else []))
        pool = self.pool()
        n_carry = self.draw(st.integers(0, min(2, len(pool))))
        carried = self.draw(st.lists(st.sampled_from(pool), min_size=n_carry, max_size=n_carry)) if pool else []
        with b.for_(lo, hi, step, carried=carried, iv_name=self.pick([None, "t", "i"])) as fr:
            self.scopes.append(list(fr.carried))
            self.index_values.append(fr.iv)
            self.ops(tensors, 0, 5)
            if depth < 2 and self.draw(st.integers(0, 3)) == 0:
                self.for_loop(tensors, outputs, depth + 1)
            if self.boolean():
                self.store(outputs)
            nxt = []
            for c in fr.carried:
                t = c.ttype
                mode = self.draw(st.integers(0, 2))
                if mode == 0:
                    nxt.append(c)
                    continue
                same = [v for v in self.pool() if v.type == t and v is not c]
                if mode == 1 and same:
                    nxt.append(self.pick(same))
                    continue
                if t.dtype.is_bool:
                    nxt.append(b.binary("xor", c, True))
                else:
                    s = self.pick(self.pool())
                    if s.ttype.rank:
                        s = b.reduce("max", s)
                    if s.ttype.dtype.is_bool:
                        s = b.cast(s, DType.I32)
                    nxt.append(b.binary("add", c, b.cast(s, t.dtype)))
            fr.yield_(nxt)
            self.index_values.pop()
            self.scopes.pop()
        for r in fr.results:
            self.add(r)

    def if_stmt(self, tensors, outputs) -> None:
        """A tile.if on a scalar bool: each branch draws ops (and maybe a store) and yields
        values of the types the results take, from what is in scope there."""
        b = self.b
        scalars = [v for v in self.pool() if v.ttype.rank == 0 and not v.ttype.dtype.is_bool]
        if scalars and self.boolean():
            s = self.pick(scalars)
            cond = b.cmp(self.pick(["lt", "ge", "eq"]), s, 0)
        else:
            cond = b.const(self.boolean(), DType.BOOL)
        kinds = [v.type for v in self.pool()]
        n_results = self.draw(st.integers(0, min(2, len(kinds))))
        types = self.draw(st.lists(st.sampled_from(kinds), min_size=n_results, max_size=n_results)) if kinds else []
        branches = []
        for _ in range(2):
            self.scopes.append([])
            with b.region() as ops:
                self.ops(tensors, 0, 3)
                if self.boolean():
                    self.store(outputs)
                values = [self.pick([v for v in self.pool() if v.type == t]) for t in types]
            self.scopes.pop()
            branches.append((ops, values))
        (then_ops, then_values), (else_ops, else_values) = branches
        for r in b.if_(cond, then_ops, then_values, else_ops, else_values, [self.name() for _ in types]):
            self.add(r)

    def body(self, f) -> None:
        b = self.b
        inputs = [v for v in f.args[: len(f.args) - self.n_outputs]]
        outputs = list(f.args[len(f.args) - self.n_outputs:])
        tensors = [v for v in inputs if v.ttype.space is not MemSpace.REG]
        for v in inputs:
            if v.ttype.space is MemSpace.REG:
                self.add(v)
                if v.ttype.dtype.is_int:
                    self.index_values.append(v)   # an i32 scalar param as an index (cast to index)
        n_loops = self.draw(st.integers(1, 2))
        for _ in range(n_loops):
            rank = self.draw(st.integers(1, 3))
            bounds = []
            for _ in range(rank):
                lo = self.pick([0, 0, 1])
                hi = b.dim(self.pick(self.symbols)) if self.symbols and self.boolean() else self.draw(st.integers(0, 5))
                bounds.append((lo, hi))
            names = self.draw(st.lists(st.sampled_from(["i", "j", "m", "n", "h"]), min_size=rank, max_size=rank))
            with b.parallel(bounds, names=names if self.boolean() else None) as ivs:
                self.scopes.append([])
                self.index_values.extend(ivs)
                self.ops(tensors, 1, 8)
                if self.boolean():
                    self.for_loop(tensors, outputs, 0)
                if self.draw(st.integers(0, 2)) == 0:
                    self.if_stmt(tensors, outputs)
                self.ops(tensors, 0, 4)
                for _ in range(self.draw(st.integers(1, 2))):
                    self.store(outputs)
                del self.index_values[-rank:]
                self.scopes.pop()


@st.composite
def programs(draw):
    """A random well-typed kfc.func, and the symbols its signature declares."""
    symbols = draw(st.lists(st.sampled_from(SYMBOLS), unique=True, max_size=3))
    g = _Gen(draw, symbols)
    inputs, outputs, defaults = g.signature()
    g.n_outputs = len(outputs)
    with g.b.func(draw(st.sampled_from(["f", "kernel", "k2"])), inputs=inputs, outputs=outputs,
                  defaults=defaults) as f:
        g.body(f)
    return f.op


@st.composite
def programs_and_sizes(draw):
    func = draw(programs())
    sizes = {s: draw(st.integers(2, 9)) for s in func.symbols}
    return func, sizes
