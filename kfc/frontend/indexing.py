"""Indexing and slicing: loads through a tensor's index, `None` axes on tiles, the items of a
store's index, and the affine analysis that proves a slice's size a compile-time constant."""

from __future__ import annotations

import lark

from ..ir.builder import ALL, Slice
from ..ir.core import Value
from .values import Tensor


class IndexLowering:
    """Subscripts of tensors and tiles, and the items (points, ':' and sized slices) of an index."""

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
                n = tensor.ttype.shape[dim]
                if isinstance(v, int) and isinstance(n, int) and v >= n:  # a symbolic dim's size is not known here
                    raise self.err(item, f"index {v} is past the end of dim {dim} of '{tensor.name}', which has "
                                         f"{n} elements ({tensor.type})", f"an index of that dim is 0 to {n - 1}")
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
        a = _affine(lo, self.size_vars) if lo is not None else ({}, 0)
        b = _affine(hi, self.size_vars)
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
        if size > MAX_SLICE:
            raise self.err(node, f"a slice of {size} elements is more than a tile holds (at most {MAX_SLICE})",
                           "slice a chunk and loop over the dim: for t in 0..N step 4096 { x[m, t:t+4096 limit N] }")
        return size


# a tile lives in registers or shared memory: 2**24 elements is far past what either holds, and
# keeps the interpreter from being asked for an array no memory holds
MAX_SLICE = 1 << 24


def _affine(node, constants: dict[str, int] | None = None):
    """An expression as ({atom: coefficient}, constant), or None when it is not linear.
    Atoms are names (but those `constants` binds, size type parameters); anything else
    non-constant makes it non-affine. A chain of + and - is walked in a loop (its length is
    unbounded)."""
    constants = constants or {}
    if not isinstance(node, lark.Tree):
        return None
    if node.data in ("add", "sub"):
        spine = []
        while isinstance(node, lark.Tree) and node.data in ("add", "sub"):
            spine.append(node)
            node = node.children[0]
        acc = _affine(node, constants)
        for step in reversed(spine):
            b = _affine(step.children[1], constants)
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
        name = str(node.children[0])
        return ({}, constants[name]) if name in constants else ({name: 1}, 0)
    if node.data == "mul":
        a, b = _affine(node.children[0], constants), _affine(node.children[1], constants)
        if a is None or b is None:
            return None
        if not a[0]:
            return {k: a[1] * v for k, v in b[0].items()}, a[1] * b[1]
        if not b[0]:
            return {k: b[1] * v for k, v in a[0].items()}, a[1] * b[1]
        return None
    if node.data == "neg":
        a = _affine(node.children[0], constants)
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
