"""The `.kfc` op definition to tile IR: the Lowerer, which reads the op's header (type
parameters, inputs, outputs, defaults) and lowers its body with the statement, expression,
indexing and call mixins. Typing rules live in the IR builder; the front end adds the source
spans and the language's own rules (what may be assigned where, what a slice may be)."""

from __future__ import annotations

import difflib

import lark

from ..diagnostics import KfcError, Span
from ..ir import constexpr
from ..ir.builder import Builder
from ..ir.core import Value
from ..ir.dtypes import DTYPE_NAMES, DType, parse_dtype
from ..ir.func import FuncOp
from ..ir.tile_ops import StoreOp
from ..ir.types import MemSpace, SymDim, TensorType
from ..ir.verifier import check_as_written, verify
from .calls import CallLowering
from .expressions import ExpressionLowering, shorten
from .indexing import IndexLowering
from .scopes import Frame, ScopeLowering
from .statements import StatementLowering

KEYWORDS = {"op", "parallel", "for", "if", "else", "in", "step", "carry", "limit", "None", "true", "false",
            "check", "metric", "targets"}
MAX_DIM = 2**62


def span_of(file: str, node) -> Span:
    if isinstance(node, lark.Token):
        return Span(file, node.line, node.column, node.end_line or node.line, node.end_column or node.column + 1)
    m = node.meta
    if getattr(m, "empty", True):
        return Span(file, 1, 1, 1, 2)
    return Span(file, m.line, m.column, m.end_line, m.end_column)


class Lowerer(ScopeLowering, StatementLowering, ExpressionLowering, IndexLowering, CallLowering):
    """One op definition to one verified function: this class reads the header; the mixins lower
    the body's statements, expressions, indexes and calls, all on the state set up here."""

    def __init__(self, file: str, text: str, dtypes: dict[str, str] | None = None) -> None:
        self.file = file
        self.text = text
        self.requested_dtypes = dict(dtypes or {})
        self.type_vars: dict[str, DType] = {}      # T -> the dtype it is instantiated with
        self.size_vars: dict[str, int] = {}        # C -> the size it is instantiated with (a constant)
        self.type_params: list[tuple[str, tuple[str, ...]]] = []
        self.typed_params: dict[str, str] = {}     # parameter -> the type parameter its dtype is
        self.b = Builder()
        self.frames: list[Frame] = []
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
        """`op f<T: bf16 | f16>(...)`: T takes the requested dtype, else the first listed; `op
        f<C: 64 | 32>(...)`: C is the requested size, else the first, a constant in the body
        (slice sizes, loop steps, masks) and in the metric."""
        if node is None:
            unknown = sorted(self.requested_dtypes)
            if unknown:
                raise KfcError(f"the op has no type parameter {unknown[0]}", None,
                               "declare one, e.g. op f<T: bf16 | f16>(x: T[N]) -> (y: T[N])")
            return
        for tp in node.children:
            name, *options = tp.children
            n = str(name)
            if n in self.type_vars or n in self.size_vars:
                raise self.err(name, f"type parameter {n} is declared twice")
            if parse_dtype(n) is not None:
                raise self.err(name, f"'{n}' is a dtype; a type parameter needs another name, e.g. T")
            if any(o.type == "INT" for o in options):
                self.size_vars[n] = int(self.bound_option(tp, n, self.size_options(n, options)))
                continue
            for k, o in enumerate(options):
                if parse_dtype(str(o)) is None:
                    raise self.err(o, f"unknown dtype '{o}' for type parameter {n}",
                                   f"dtypes are {', '.join(DTYPE_NAMES)}")
                if str(o) in map(str, options[:k]):
                    raise self.err(o, f"type parameter {n} lists {o} twice", "list each dtype once")
            self.type_vars[n] = parse_dtype(self.bound_option(tp, n, [str(o) for o in options]))
        unknown = sorted(set(self.requested_dtypes) - set(self.type_vars) - set(self.size_vars))
        if unknown:
            raise KfcError(f"the op has no type parameter {unknown[0]}", self.span(node),
                           f"its type parameters are {', '.join([*self.type_vars, *self.size_vars])}")

    def size_options(self, n: str, options) -> list[str]:
        """A type parameter of sizes: every option a positive integer, each once."""
        opts = []
        for o in options:
            if o.type != "INT":
                raise self.err(o, f"type parameter {n} takes sizes; '{o}' is not one",
                               "list whole numbers, e.g. C: 64 | 32 | 16 (or dtypes alone, e.g. T: bf16 | f16)")
            if int(o) <= 0 or str(int(o)) in opts:
                raise self.err(o, f"type parameter {n}'s sizes are positive and each listed once, not {o}")
            opts.append(str(int(o)))
        return opts

    def bound_option(self, tp, n: str, opts: list[str]) -> str:
        """The option type parameter n is instantiated with (the requested one, else the first),
        the parameter recorded with its options."""
        want = self.requested_dtypes.get(n, opts[0])
        if want not in opts:
            raise KfcError(f"type parameter {n} takes {' | '.join(opts)}, not {want}", self.span(tp),
                           f"choose one of {', '.join(opts)}")
        self.type_params.append((n, tuple(opts)))
        return want

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
                    if t.dtype.is_int and isinstance(dv, str) and isinstance(self.probe_default(dv), float):
                        # an expression of dims that makes a float (N ** -1, N / 2) would be cut to an integer
                        raise self.err(default, f"the default of {pname}, {dv}, is a float expression, but {pname} "
                                       f"is {t.dtype}", "divide with // for an integer default, or declare "
                                       f"{pname}: f32")
            self.param_spans[str(pname)] = self.span(p)
            self.type_spans[str(pname)] = self.span(tspec)
        for n in seen:
            if n in self.symbols:
                raise self.err(seen[n], f"{n} names both a parameter and a shape dimension",
                               "rename one of them")
            if n in self.size_vars:
                raise self.err(seen[n], f"{n} names both a parameter and a type parameter", "rename one of them")
        input_syms = {d.name for _, t in inputs for d in t.shape if isinstance(d, SymDim)}
        required_syms = {d.name for _, t in inputs if not t.optional for d in t.shape if isinstance(d, SymDim)}
        for n, t in outputs:
            missing = sorted(t.symbols - input_syms)
            if missing:
                raise KfcError(f"output {n} uses dimension {missing[0]}, which no input has",
                               self.param_spans[n], "outputs are sized from the inputs; give an input that dim")
            optional_only = sorted(t.symbols - required_syms)
            if optional_only:
                holders = ", ".join(name for name, ti in inputs if optional_only[0] in ti.symbols)
                raise KfcError(f"output {n} uses dimension {optional_only[0]}, which only the optional input "
                               f"{holders} has: without it the output has no size", self.param_spans[n],
                               f"give {optional_only[0]} through a required input too, or make {holders} required")
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
                self.frames.append(Frame("func"))
                self.block(body)
                self.frames.pop()
        func = f.op
        written = {op.operands[1].name for op in func.walk() if isinstance(op, StoreOp)}
        for n, t in outputs:
            if n not in written and not t.optional:
                raise KfcError(f"output {n} is never written", self.param_spans[n],
                               f"store into it, e.g. {n}[...] = ..., or assign the whole tensor with {n} = ...")
        return check_as_written(verify(func))

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
                    raise self.err(d, f"a dim of {shorten(str(n))} is out of range", "dims are from 1 to 2**62")
                shape.append(n)
                continue
            sym = str(d.children[0])
            if sym in KEYWORDS or self.dtype_named(sym) is not None:
                raise self.err(d, f"'{sym}' cannot name a dimension")
            if sym in self.size_vars and d.data == "sym_dim":  # a size parameter: the size it is bound to
                shape.append(self.size_vars[sym])
                continue
            if sym in self.size_vars:
                raise self.err(d, f"{sym} is a size parameter; write its multiple of a dim as a dim of its own")
            self.symbols.setdefault(sym, self.span(d))
            off = 0 if d.data == "sym_dim" else int(d.children[1]) * (1 if d.data == "add_dim" else -1)
            if abs(off) > MAX_DIM:
                raise self.err(d, f"the offset {shorten(str(off))} is out of range", "dim offsets are at most 2**62")
            shape.append(SymDim(sym, off))
        return TensorType(dtype, tuple(shape), MemSpace.GLOBAL, optional=opt is not None)

    @staticmethod
    def probe_default(text: str):
        """A default expression's value at typical sizes (64 for every dim): its type tells an
        integer expression from a float one."""
        return constexpr.evaluate(text, {sym: 64 for sym in constexpr.symbols_of(text)})

    def default_value(self, node):
        """A number, or the source text of a constant expression over dims."""
        if node.data in ("int_lit", "float_lit"):
            return self.number(node)
        if node.data == "neg" and node.children[0].data in ("int_lit", "float_lit"):
            return -self.number(node.children[0])
        text = self.text[node.meta.start_pos:node.meta.end_pos]
        try:
            # evaluated at specialisation; try it now at typical sizes to catch 1 / 0 early
            self.probe_default(text)
        except constexpr.ConstExprError as e:
            raise self.err(node, str(e), "a default is a number or an expression of dims, e.g. K ** -0.5") from None
        return text
