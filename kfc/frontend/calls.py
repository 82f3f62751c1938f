"""Calls: the builtins table (name -> handler, keywords, positional arity), their handlers,
dtype conversions such as f32(x), and the checks on a call's arguments."""

from __future__ import annotations

import difflib
from typing import Callable

import lark

from ..ir.core import Value
from ..ir.dtypes import DTYPE_NAMES, DType
from ..ir.types import SymDim
from .values import is_number


class CallLowering:
    """A call checked against the table and handed to its handler; readers for constant arguments."""

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
                if is_number(v):
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
    def const_int(self, node, what: str, hint: str | None = None) -> int:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(node, f"{what} must be a constant integer", hint)
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


# --- builtins: name -> (handler, keyword names, min positional, max positional) ----------------

def _unary(fn):
    def h(lw: CallLowering, node, pos, kw):
        v = lw.value(pos[0])
        if is_number(v):
            v = lw.b.literal(float(v) if not isinstance(v, bool) else v, None)
        return lw.b.unary(fn, v)
    return h


def _minmax(fn):
    def h(lw: CallLowering, node, pos, kw):
        if len(pos) == 2:
            if kw:
                raise lw.err(node, f"{fn}(a, b) is elementwise and takes no keywords",
                             f"for a reduction write {fn}(x, axis=...)")
            return lw.b.binary(fn, lw.value(pos[0]), lw.value(pos[1]))
        return _reduce(fn)(lw, node, pos, kw)
    return h


def _reduce(kind):
    def h(lw: CallLowering, node, pos, kw):
        x = lw.tile_value(pos[0], f"{kind}'s operand")
        axis = lw.const_axes(kw["axis"], "axis") if "axis" in kw else None
        keep = lw.const_bool(kw["keepdims"], "keepdims") if "keepdims" in kw else False
        return lw.b.reduce(kind, x, axis, keep)
    return h


def _scan(kind: str):
    """cumsum, cumprod, cummax, cummin: a prefix reduction along an axis."""
    def h(lw: CallLowering, node, pos, kw):
        x = lw.tile_value(pos[0], f"cum{kind}'s operand")
        axis = lw.const_int(kw["axis"], "axis") if "axis" in kw else 0
        excl = lw.const_bool(kw["exclusive"], "exclusive") if "exclusive" in kw else False
        rev = lw.const_bool(kw["reverse"], "reverse") if "reverse" in kw else False
        return lw.b.scan(kind, x, axis, excl, rev)
    return h


def _where(lw: CallLowering, node, pos, kw):
    c, a, b = (lw.value(p) for p in pos)
    return lw.b.where(c, a, b)


def _dot(lw: CallLowering, node, pos, kw):
    a = lw.tile_value(pos[0], "dot's lhs")
    b = lw.tile_value(pos[1], "dot's rhs")
    ta = lw.const_bool(kw["trans_a"], "trans_a") if "trans_a" in kw else False
    tb = lw.const_bool(kw["trans_b"], "trans_b") if "trans_b" in kw else False
    return lw.b.dot(a, b, ta, tb)


def _tri_inv(lw: CallLowering, node, pos, kw):
    return lw.b.tri_inv(lw.tile_value(pos[0], "tri_inv's operand"))


def _iota(lw: CallLowering, node, pos, kw):
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


def _bitcast(lw: CallLowering, node, pos, kw):
    x = lw.tile_value(pos[0], "bitcast's operand")
    return lw.b.bitcast(x, lw.dtype_arg(pos[1]))


def _tri(lower: bool):
    name, keep = ("tril", ">=") if lower else ("triu", "<=")
    hint = (f"a mask's sizes are fixed where the op is read: give it a size parameter (op f<C: 64 | 32>(...), "
            f"{name}(C)), or build the mask from indices, iota(R)[:, None] {keep} iota(N)[None, :]")

    def h(lw: CallLowering, node, pos, kw):
        rows = lw.const_int(pos[0], f"{name}'s row count", hint)
        cols = lw.const_int(pos[1], f"{name}'s column count", hint) if len(pos) > 1 else rows
        k = lw.const_int(kw["k"], "k") if "k" in kw else 0
        if rows <= 0 or cols <= 0:
            raise lw.err(node, "a triangular mask needs positive sizes")
        return lw.b.tri(rows, cols, lower, k)
    return h


def _fill(value):
    def h(lw: CallLowering, node, pos, kw):
        shape = lw.shape_arg(pos[0])
        v = value
        if v is None:
            v = lw.value(pos[1])
            if not is_number(v):
                raise lw.err(pos[1], "full's value must be a constant number")
        dtype = lw.dtype_arg(kw["dtype"]) if "dtype" in kw else (DType.BOOL if isinstance(v, bool) else DType.F32)
        return lw.b.const(v, dtype, shape)
    return h


def _scratch(lw: CallLowering, node, pos, kw):
    if len(lw.frames) > 1:
        raise lw.err(node, "a scratch tensor is made outside the parallel loops, for the whole call",
                     "write `w = scratch([...], dtype=f32)` before the loop that stores into it")
    dtype = lw.dtype_arg(kw["dtype"]) if "dtype" in kw else DType.F32
    shape = pos[0]
    for c in shape.children if isinstance(shape, lark.Tree) and shape.data == "list_lit" else ():
        if isinstance(c, lark.Tree) and c.data not in ("name", "int_lit"):
            raise lw.err(c, "a scratch tensor's sizes are dims or numbers; arithmetic on dims is not supported yet",
                         "add an input whose shape gives the size (a dim of its own), or pad to a dim")
    return lw.b.scratch(dtype, lw.shape_arg(shape))


def _transpose(lw: CallLowering, node, pos, kw):
    x = lw.tile_value(pos[0], "transpose's operand")
    perm = None
    if len(pos) > 1:
        perm = lw.const_axes(pos[1], "a permutation entry")
        if isinstance(perm, int):
            raise lw.err(pos[1], "the permutation is a list, e.g. [1, 0]")
    return lw.b.transpose(x, perm)


def _reshape(lw: CallLowering, node, pos, kw):
    x = lw.tile_value(pos[0], "reshape's operand")
    return lw.b.reshape(x, lw.shape_arg(pos[1]))


_BUILTINS: dict[str, tuple[Callable, tuple[str, ...], int, int]] = {
    **{fn: (_unary(fn), (), 1, 1) for fn in
       ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softplus", "tanh", "abs", "round")},
    "bitcast": (_bitcast, (), 2, 2),
    "max": (_minmax("max"), ("axis", "keepdims"), 1, 2),
    "min": (_minmax("min"), ("axis", "keepdims"), 1, 2),
    "sum": (_reduce("sum"), ("axis", "keepdims"), 1, 1),
    "mean": (_reduce("mean"), ("axis", "keepdims"), 1, 1),
    "prod": (_reduce("prod"), ("axis", "keepdims"), 1, 1),
    **{f"cum{k}": (_scan(k), ("axis", "exclusive", "reverse"), 1, 1) for k in ("sum", "prod", "max", "min")},
    "where": (_where, (), 3, 3),
    "dot": (_dot, ("trans_a", "trans_b"), 2, 2),
    "tri_inv": (_tri_inv, (), 1, 1),
    "iota": (_iota, ("dtype",), 1, 1),
    "tril": (_tri(True), ("k",), 1, 2),
    "triu": (_tri(False), ("k",), 1, 2),
    "zeros": (_fill(0), ("dtype",), 1, 1),
    "ones": (_fill(1), ("dtype",), 1, 1),
    "full": (_fill(None), ("dtype",), 2, 2),
    "scratch": (_scratch, ("dtype",), 1, 1),
    "transpose": (_transpose, (), 1, 2),
    "reshape": (_reshape, (), 2, 2),
}

_SIGNATURES = {
    **{fn: f"{fn}(x)" for fn in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "softplus", "tanh", "abs",
                                 "round")},
    "bitcast": "bitcast(x, u8): the same bits as another dtype of one width",
    "max": "max(a, b) elementwise, or max(x, axis=..., keepdims=...) to reduce",
    "min": "min(a, b) elementwise, or min(x, axis=..., keepdims=...) to reduce",
    "sum": "sum(x, axis=..., keepdims=...)", "mean": "mean(x, axis=..., keepdims=...)",
    "prod": "prod(x, axis=..., keepdims=...)",
    **{f"cum{k}": f"cum{k}(x, axis=0, exclusive=false, reverse=false)" for k in ("sum", "prod", "max", "min")},
    "where": "where(cond, a, b)",
    "dot": "dot(a, b, trans_a=false, trans_b=false)", "iota": "iota(n, dtype=i32)",
    "tri_inv": "tri_inv(x): (I + tril(x, -1))^-1 of a square f32 tile",
    "tril": "tril(rows, cols=rows, k=0)", "triu": "triu(rows, cols=rows, k=0)",
    "zeros": "zeros([dims], dtype=f32)", "ones": "ones([dims], dtype=f32)",
    "full": "full([dims], value, dtype=f32)", "transpose": "transpose(x, [perm])",
    "scratch": "scratch([dims], dtype=f32): a tensor for this call, stored by one parallel loop, read by a later one",
    "reshape": "reshape(x, [dims])",
}

BUILTIN_NAMES = tuple(_BUILTINS)
