"""lower-ptx: refine tile ops in a mapped row program into PTX instruction families.

- loads and stores become vector `ptx.ld` / `ptx.st` of up to 16 bytes per access, with a
  cache hint: rows that stream through once (they move with the row index) take `stream`
  (default `cs`, evict-first: measured 5-10% faster than `nc_na` on the H200 for rows of up to
  4096 bf16), data every row re-reads (a weight vector) keeps the default so it stays in cache;
- with `approx` (auto: on for a value no exact output depends on — an integer, bool or fp8
  output, where one ulp moves a code — when every float output of 16 bits or more tolerates
  1e-5 relative error, the approximate instructions' error being about 2^-22; a router's softmax
  weight takes ex2.approx while its expert index, from the same row, stays exact), f32 rsqrt and exp become
  rsqrt.approx and ex2.approx (exp(x) = 2^(x·log2 e)), so do the exponentials of the steps of a
  (max, sum of exp) reduction (gpu.*_max_sumexp), and a division of a tile by a value
  the whole row shares (softmax's e / sum(e)) becomes a product with its reciprocal, taken once:
  an IEEE division costs a dozen instructions an element, the product one, for at most one
  more rounding (about 2^-23). ncu on the H200 found softmax at rows of 65536 bound by issue,
  not by memory (SM 82%, DRAM 71%), the division being the costliest part of its last stretch;
- f32 row tiles rounded to bf16/f16 become packed conversions (two per instruction).

Options: approx = auto | on | off; stream = the cache hint for streaming loads (cs, nc_na, lu,
or none); store = the cache hint for stores.
"""

from __future__ import annotations

import math

import attrs

from ..ir.core import Value
from ..ir.dtypes import DType
from ..ir.gpu_ops import MAX_SUMEXP_STEPS, LaunchOp
from ..ir.ptx_ops import CACHE_HINTS, CvtPackOp, Ex2ApproxOp, LdOp, RsqrtApproxOp, StOp
from ..ir.rewrite import ValueMap, defining_ops, memory_written, rebuild_block
from ..ir.smem_ops import SmemAllocOp
from ..ir.tile_ops import BINARY_CLASSES, YieldOp, UNARY_CLASSES, BroadcastOp, CastOp, ConstOp, LoadOp, StoreOp
from ..ir.types import TensorType
from .base import Pass, PassError, define_pass, option
from .rows import find_row_loop, with_loop_body
from ..model.spec import CheckSpec

APPROX_MIN_TOLERANCE = 1e-5
HINT_NAMES = ("none",) + tuple(h for h in CACHE_HINTS if h)


def _hint(name: str, text: str) -> str:
    v = "" if text == "none" else text
    if v not in CACHE_HINTS:
        raise PassError(f"lower-ptx: {name}={text!r} is not a cache hint",
                        hint="use one of none, " + ", ".join(h for h in CACHE_HINTS if h))
    return v


@define_pass("lower-ptx", "vector ld/st with cache hints, approximate rsqrt/exp, packed conversions")
class LowerPtx(Pass):
    approx: str = option("auto", choices=("auto", "on", "off"))
    stream: str = option("cs", choices=HINT_NAMES)
    store: str = option("cs", choices=HINT_NAMES)

    def run(self, func, ctx):
        if self.approx not in ("auto", "on", "off"):
            raise PassError(f"lower-ptx: approx must be auto, on or off, not {self.approx!r}")
        stream, store_hint = _hint("stream", self.stream), _hint("store", self.store)
        exact = exact_outputs(func)
        approx = self.approx == "on" or (self.approx == "auto" and ctx_tolerance(ctx, func) >= APPROX_MIN_TOLERANCE)
        launch = find_row_loop(func, LaunchOp)
        may = approximable(func, ctx, self.approx)
        row_values = launch.row_dependent_values()
        counts = {"ld": 0, "st": 0, "approx": 0, "cvt": 0}
        defs = defining_ops(func)

        def shared_divisor(op) -> Value | None:
            """The scalar a `tile.div` (its operands already mapped) divides every element by,
            if it is one."""
            d = op.operands[1]
            b = defs.get(d)
            if d.ttype.rank == 0:
                return None  # a scalar division is done once already
            if isinstance(b, BroadcastOp) and b.operands[0].ttype.rank == 0:
                return b.operands[0]
            return None

        def access_vec(t: TensorType, tile: TensorType) -> int:
            if tile.rank == 0 or tile.layout is None:
                return 1
            return max(1, min(tile.layout.get("vec"), 16 // t.dtype.itemsize))

        def transform(op, vmap: ValueMap):
            if LoadOp.unrefined(op):
                moves = any(v in row_values for v in op.operands[1:])
                counts["ld"] += 1
                return [LdOp(operands=op.operands, results=op.results, loc=op.loc, index=op.index, other=op.other,
                             vec=access_vec(op.operands[0].ttype, op.result.ttype), cache=stream if moves else "")]
            if StoreOp.unrefined(op):
                counts["st"] += 1
                return [StOp(operands=op.operands, results=(), loc=op.loc, index=op.index,
                             vec=access_vec(op.operands[1].ttype, op.operands[0].ttype), cache=store_hint)]
            t = op.results[0].type if op.results else None
            f32 = isinstance(t, TensorType) and t.dtype is DType.F32 and may(op.results[0])
            if approx and f32 and isinstance(op, UNARY_CLASSES["rsqrt"]):
                counts["approx"] += 1
                ctx.approximated(self, "rsqrt.approx for rsqrt", op.loc)
                return [RsqrtApproxOp(operands=op.operands, results=op.results, loc=op.loc)]
            if approx and f32 and isinstance(op, UNARY_CLASSES["exp"]):
                counts["approx"] += 1
                ctx.approximated(self, "ex2.approx for exp", op.loc)
                return exp2_of_scaled(op.operands[0], math.log2(math.e), op.result, op.loc)
            if approx and isinstance(op, MAX_SUMEXP_STEPS) and not op.approx and all(map(may, op.results)):
                counts["approx"] += 1
                ctx.approximated(self, "ex2.approx in a running max and sum of exponentials", op.loc)
                return [attrs.evolve(op, approx=True)]
            if approx and f32 and isinstance(op, BINARY_CLASSES["div"]) and shared_divisor(op) is not None:
                counts["approx"] += 1
                ctx.approximated(self, "a product with the reciprocal for a division by one value a row shares", op.loc)
                s = vmap[shared_divisor(op)]
                scalar = TensorType(DType.F32)
                one = ConstOp(operands=(), results=(Value(scalar),), loc=op.loc, value=1.0)
                inv = BINARY_CLASSES["div"](operands=(one.result, s), results=(Value(scalar),), loc=op.loc)
                b = BroadcastOp(operands=(inv.result,), results=(Value(op.operands[1].type),), loc=op.loc)
                m = BINARY_CLASSES["mul"](operands=(op.operands[0], b.result), results=op.results, loc=op.loc)
                return [one, inv, b, m]
            if (CastOp.unrefined(op) and op.result.ttype.rank == 1
                    and op.operands[0].ttype.dtype is DType.F32 and op.result.ttype.dtype in (DType.BF16, DType.F16)):
                counts["cvt"] += 1
                return [CvtPackOp(operands=op.operands, results=op.results, loc=op.loc)]
            return None

        body = rebuild_block(launch.body, ValueMap(), transform)
        why = (f" (approx off: outputs checked to {ctx_tolerance(ctx, func):g})" if self.approx == "auto" else " (approx off)") \
            if not approx else "" if not exact or self.approx != "auto" else \
            f" (approx off: exact outputs {exact} from staged rows)" if staged_rows(func) else f" (none that exact outputs {exact} need)"
        ctx.note(self, f"{counts['ld']} loads, {counts['st']} stores, {counts['approx']} approximate functions{why}"
                       f", {counts['cvt']} packed conversions")
        return with_loop_body(func, launch, body)


def scalar_like(value: float, like: Value, loc) -> tuple[list, Value]:
    """An f32 constant, broadcast to like's shape where like is a tile: (its ops, the value)."""
    c = ConstOp(operands=(), results=(Value(TensorType(DType.F32)),), loc=loc, value=value)
    if not like.ttype.rank:
        return [c], c.result
    b = BroadcastOp(operands=(c.result,), results=(Value(like.type),), loc=loc)
    return [c, b], b.result


def exp2_of_scaled(x: Value, scale: float, result: Value, loc) -> list:
    """The ops computing result = 2^(x * scale) on ex2.approx (exp with scale log2 e)."""
    ops, s = scalar_like(scale, x, loc)
    m = BINARY_CLASSES["mul"](operands=(x, s), results=(Value(x.type),), loc=loc)
    return ops + [m, Ex2ApproxOp(operands=(m.result,), results=(result,), loc=loc)]


def staged_rows(func) -> bool:
    """Whether stage-rows staged the program's rows in shared memory."""
    return any(isinstance(op, SmemAllocOp) for op in func.walk())


def approximable(func, ctx, mode: str = "auto"):
    """Whether lower-ptx{approx=mode} may compute a value of `func` approximately (see the module
    docstring): a predicate on values."""
    if mode == "on":
        return lambda v: True
    if mode == "off" or ctx_tolerance(ctx, func) < APPROX_MIN_TOLERANCE:
        return lambda v: False
    exact = [v for v in func.outputs if v.ttype.dtype.is_exact]
    if exact and staged_rows(func):
        # staged rows of a program with exact outputs stay as they were measured: the router's
        # softmax weight approximated at rows of 32768 (staged, 64 elements a thread) took 162
        # registers instead of 128, one CTA an SM instead of two, and ran 0.68x as fast (H100)
        return lambda v: False
    keep = feeds(func, exact)
    return lambda v: v not in keep


def feeds(func, tensors) -> set:
    """Every value the contents of `tensors` depend on: what is stored into them, the indices,
    conditions and loop bounds that decide where and whether, and what those are computed from,
    through carried loop values and nested regions. An op with no results that writes memory in
    the set (a store into the tensor, a copy into a buffer the tensor is filled from) makes all its
    operands part of it."""
    values = set(tensors)

    def visit(block) -> bool:
        """Mark what `block`'s ops need; whether any op in it is needed."""
        any_needed = False
        for op in block.ops:
            if isinstance(op, YieldOp):  # what it hands back is needed only as far as its results are
                continue
            inner = any([visit(r) for r in op.regions])  # every region, not just up to the first
            makes = any(v in values for v in (*op.results, *(a for r in op.regions for a in r.args)))
            writes = any(v in values for v in memory_written(op))
            if makes:  # what the regions hand back becomes the results and carried values
                values.update(v for r in op.regions if r.ops and isinstance(r.ops[-1], YieldOp)
                              for v in r.ops[-1].operands)
            if makes or inner or writes:
                values.update(op.operands)
                any_needed = True
        return any_needed

    size = -1
    while size != len(values):  # carried values and buffers: until nothing more is needed
        size = len(values)
        visit(func.body)
    return values


def exact_outputs(func) -> str:
    """The outputs where one rounding step moves a code (integers, bools, fp8), as `name (dtype)`."""
    return ", ".join(f"{v.name} ({v.ttype.dtype})" for v in func.outputs
                     if v.ttype.dtype.is_exact)


def ctx_tolerance(ctx, func) -> float:
    """The smallest relative tolerance any floating-point output is checked with."""
    check = getattr(ctx, "check", None) or CheckSpec()
    tols = [check.tolerance_for(str(v.ttype.dtype)) for v in func.outputs if v.ttype.dtype.is_float]
    return min(tols) if tols else 1.0
