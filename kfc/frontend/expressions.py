"""Expressions: literals, names, arithmetic and comparisons (folded while both sides are
numbers), powers, `.T`; subscripts go to indexing, calls to the builtins."""

from __future__ import annotations

import math
from typing import Callable

import lark

from ..diagnostics import KfcError
from ..ir import constexpr
from ..ir.builder import ALL, BuildError
from ..ir.core import Value
from .values import Tensor, is_number


def shorten(text: str) -> str:
    return text if len(text) <= 30 else text[:27] + "..."


_BINOPS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "div", "mod": "rem",
           "and_": "and", "or_": "or"}
# the left-associative chains the lowering walks in a loop (they do not count as nesting)
NESTING_CHAINS = frozenset(_BINOPS)
# the grammar's wrappers, no level of their own: a call's arguments, an index and its entries, a
# statement around its block (the block counts), the op around its body
NESTING_FREE = frozenset({"args", "kwarg", "index", "idx_point", "idx_slice", "idx_new", "assign", "store",
                          "accumulate", "parallel", "prange", "for_loop", "if_stmt", "carry", "op_def"})
_BINOP_PY: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "and_": lambda a, b: a & b, "or_": lambda a, b: a | b,
}
_CMPS = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne"}
_CMP_PY = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


class ExpressionLowering:
    """Lowering an expression to a value, or to a Python number while it is constant."""

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
                raise self.err(node, f"the integer {shorten(str(node.children[0]))} does not fit in 64 bits",
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
            if is_number(a) and is_number(b):
                return bool(_CMP_PY[kind](a, b))
            with self.b.at(self.span(node)):
                return self.b.cmp(_CMPS[kind], a, b)
        if kind == "neg":
            a = self.value(node.children[0])
            if isinstance(a, bool):
                raise self.err(node, "'-' of a boolean", "use ~ to negate a condition")
            if is_number(a):
                return -a
            return self.b.unary("neg", a)
        if kind == "invert":
            a = self.value(node.children[0])
            if isinstance(a, bool):
                return not a
            if is_number(a):
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

    def number(self, node):
        """A literal as a Python number (the checks of `_value`: 64-bit integers, finite floats)."""
        return self._value(node)

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
        if is_number(a) and is_number(b):
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
        if is_number(a) and is_number(e):
            try:
                return constexpr.power(a, e)
            except (OverflowError, ValueError) as err:
                raise self.err(node, f"this constant cannot be computed: {err}") from None
            except ZeroDivisionError:
                raise self.err(node, "0 to a negative power in a constant") from None
        with self.b.at(self.span(node)):
            if is_number(e):
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
