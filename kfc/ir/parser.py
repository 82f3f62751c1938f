"""Text to IR: the inverse of kfc.ir.printer. Spans point into the IR text, so the verifier's
messages on parsed IR name `file.kir:line:col`."""

from __future__ import annotations

import enum
import json
import math
import re

import attrs
import lark

from ..diagnostics import KfcError, Span, register_source
from ..grammar_files import MAX_NESTING, check_nesting, lalr_parser, syntax_error
from .core import OP_REGISTRY, Block, Value
from .dtypes import parse_dtype
from .func import FuncOp
from .types import Layout, MemSpace, SymDim, TensorType

GRAMMAR = "kir.lark"


def _span(file: str, node) -> Span:
    if isinstance(node, lark.Token):
        return Span(file, node.line, node.column, node.end_line or node.line,
                    node.end_column or node.column + len(node))
    m = node.meta
    if getattr(m, "empty", True):
        return Span(file, 1, 1, 1, 2)
    return Span(file, m.line, m.column, m.end_line, m.end_column)


class _Scope:
    def __init__(self, parent: "_Scope | None" = None) -> None:
        self.parent = parent
        self.values: dict[str, Value] = {}

    def lookup(self, name: str) -> Value | None:
        s = self
        while s is not None:
            if name in s.values:
                return s.values[name]
            s = s.parent
        return None


# IR text nests about four parse-tree levels per loop where `.kfc` text nests two: what
# `kfc compile` writes for the deepest `.kfc` kfc reads must read back
IR_NESTING = 4 * MAX_NESTING


class IRParser:
    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.text = text

    def parse(self) -> FuncOp:
        register_source(self.file, self.text)
        parser = lalr_parser(GRAMMAR)
        try:
            tree = parser.parse(self.text)
        except lark.exceptions.UnexpectedInput as e:
            raise syntax_error(e, parser, self.file, self.text) from None
        check_nesting(tree, self.file, limit=IR_NESTING)
        return self.func(tree.children[0])

    # --- values -----------------------------------------------------------------------------
    def define(self, scope: _Scope, tok: lark.Token, type_, loc: Span | None = None) -> Value:
        name = str(tok)[1:]
        if name in scope.values:
            raise KfcError(f"value %{name} is defined twice", _span(self.file, tok), "give each value its own name")
        v = Value(type_, name, loc)
        scope.values[name] = v
        return v

    def use(self, scope: _Scope, tok: lark.Token) -> Value:
        v = scope.lookup(str(tok)[1:])
        if v is None:
            raise KfcError(f"use of undefined value {tok}", _span(self.file, tok),
                           "values must be defined above their use, in this region or an enclosing one")
        return v

    # --- structure --------------------------------------------------------------------------
    def func(self, node) -> FuncOp:
        name_tok, ins_node, outs_node, *op_nodes = node.children
        params_in = [p for p in ins_node.children if p is not None]
        params_out = [p for p in outs_node.children if p is not None]
        scope = _Scope()
        args, defaults = [], []
        for p in params_in + params_out:
            vtok, tnode, default = p.children
            v = self.define(scope, vtok, self.type(tnode), _span(self.file, tnode))
            args.append(v)
            if default is not None:
                if p in params_out:
                    raise KfcError("outputs take no default", _span(self.file, p))
                defaults.append((v.name, self.attr_value(default)))
        body_ops = [self.op(o, scope) for o in op_nodes]
        return FuncOp(sym_name=str(name_tok), num_outputs=len(params_out), defaults=tuple(defaults),
                      regions=(Block(tuple(args), tuple(body_ops)),), loc=_span(self.file, node))

    def op(self, node, scope: _Scope):
        results_node, name_tok, operands_node, attr_node, regions_node, sig = node.children
        span = _span(self.file, node)
        cls = OP_REGISTRY.get(str(name_tok))
        if cls is None:
            close = [n for n in OP_REGISTRY if n.split(".")[-1] == str(name_tok).split(".")[-1]]
            raise KfcError(f"unknown op {name_tok}", _span(self.file, name_tok),
                           f"did you mean {close[0]}?" if close else "write an op as `kfc opt` prints one (kfc opt FILE.kfc shows a program's)")
        operands = [self.use(scope, t) for t in (operands_node.children if operands_node is not None else [])]
        in_types, out_types = self.signature(sig)
        if len(in_types) != len(operands):
            raise KfcError(f"{len(operands)} operands but the signature lists {len(in_types)} types", _span(self.file, sig))
        for v, t, tok in zip(operands, in_types, operands_node.children if operands_node is not None else []):
            if v.type != t:
                raise KfcError(f"operand {tok} has type {v.type}, but the signature says {t}", _span(self.file, tok))
        attributes = {}
        if attr_node is not None:
            for entry in attr_node.children:
                key, val = entry.children
                if str(key) in attributes:
                    raise KfcError(f"attribute {key} is given twice", _span(self.file, key))
                attributes[str(key)] = self.attr_value(val)
        known = {f.name for f in cls.attr_fields()}
        for key in attributes:
            if key not in known:
                raise KfcError(f"{cls.NAME} has no attribute {key!r}", span,
                               f"its attributes are {sorted(known)}" if known else f"{cls.NAME} takes no attributes")
        regions = []
        for rnode in regions_node.children:
            inner = _Scope(scope)
            arg_nodes = [c for c in rnode.children if isinstance(c, lark.Tree) and c.data == "block_arg"]
            op_nodes = [c for c in rnode.children if isinstance(c, lark.Tree) and c.data == "op"]
            args = tuple(self.define(inner, a.children[0], self.type(a.children[1])) for a in arg_nodes)
            regions.append(Block(args, tuple(self.op(o, inner) for o in op_nodes)))
        result_toks = results_node.children if results_node is not None else []
        if len(result_toks) != len(out_types):
            raise KfcError(f"{len(result_toks)} results named but the signature gives {len(out_types)} types", span)
        results = [self.define(scope, tok, t) for tok, t in zip(result_toks, out_types)]
        try:
            return cls(operands=tuple(operands), results=tuple(results), regions=tuple(regions), loc=span, **attributes)
        except (TypeError, ValueError) as e:
            raise attribute_error(cls, e, span) from None

    def signature(self, node):
        ins = [self.type(t) for t in node.children[0:-1] if t is not None]
        res = node.children[-1]
        outs = [self.type(t) for t in res.children if t is not None]
        return ins, outs

    # --- types and attributes ---------------------------------------------------------------
    def type(self, node) -> TensorType:
        name_tok, shape_node, space_node, layout_node, opt_tok = node.children
        dtype = parse_dtype(str(name_tok))
        if dtype is None:
            raise KfcError(f"unknown dtype {name_tok}", _span(self.file, name_tok))
        shape = []
        if shape_node is not None:
            for d in shape_node.children:
                if d is None:
                    continue
                if d.data == "lit_dim":
                    shape.append(int(d.children[0]))
                elif d.data == "sym_dim":
                    shape.append(SymDim(str(d.children[0])))
                else:
                    sym, addop, n = d.children
                    shape.append(SymDim(str(sym), int(n) if str(addop) == "+" else -int(n)))
        space = MemSpace.REG
        if space_node is not None:
            try:
                space = MemSpace(str(space_node.children[0]))
            except ValueError:
                raise KfcError(f"unknown memory space @{space_node.children[0]}", _span(self.file, space_node),
                               "spaces are " + ", ".join("@" + m.value for m in MemSpace)) from None
        layout = None
        if layout_node is not None:
            kind, *entries = layout_node.children
            params = tuple((str(e.children[0]), self.attr_value(e.children[1])) for e in entries if e is not None)
            layout = Layout(str(kind), params)
        return TensorType(dtype, tuple(shape), space, layout, opt_tok is not None)

    def attr_value(self, node):
        if isinstance(node, lark.Token):
            raise AssertionError(node)
        kind = node.data
        if kind == "string":
            return json.loads(str(node.children[0]))
        if kind == "true":
            return True
        if kind == "false":
            return False
        if kind == "none":
            return None
        if kind == "list":
            return tuple(self.attr_value(c) for c in node.children if c is not None)
        if kind == "int":
            return int(node.children[0])
        if kind == "float":
            return float(node.children[0])
        if kind == "inf":
            return math.inf
        if kind == "neg_inf":
            return -math.inf
        if kind == "nan":
            return math.nan
        raise AssertionError(kind)


def parse_ir(text: str, file: str = "<ir>") -> FuncOp:
    p = IRParser(file, text)
    return p.parse()


def attribute_error(cls, e: Exception, span) -> KfcError:
    """An op's attributes that its class refused, said in the IR's words: the ones missing, or a
    value outside an enumeration with the values it takes."""
    text = str(e)
    if isinstance(e, TypeError) and "missing" in text:
        names = re.findall(r"'(\w+)'", text.split("argument", 1)[-1])
        return KfcError(f"{cls.NAME} needs the attribute{'s' if len(names) > 1 else ''} {', '.join(names)}", span,
                        "write them in its {...} after the operands, as `kfc opt` prints such an op")
    bad = re.fullmatch(r"'(.*)' is not a valid (\w+)", text)
    for f in attrs.fields(cls) if bad else ():
        kind = f.converter  # an enumeration attribute converts its text to a member
        if isinstance(kind, type) and issubclass(kind, enum.Enum) and kind.__name__ == bad.group(2):
            return KfcError(f"{cls.NAME}: {f.name} = {bad.group(1)!r} is not one it takes", span,
                            f"{f.name} takes one of {', '.join(str(m.value) for m in kind)}")
    return KfcError(f"bad attributes for {cls.NAME}: {text}", span)
