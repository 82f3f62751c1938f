"""The pass infrastructure on the CPU: pipeline strings, the greedy rewriter, canonicalize / cse /
dce, --verify-each (and a deliberately broken pass it must catch), target gating, the tile
pass's choices, instrumentation (IR printing, timing, dump folder) and the `kfc opt` / `kfc
passes` command line.
"""

import contextlib
import enum
import io
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import ClassVar

import attrs
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from kfc.cli import main
from kfc.diagnostics import InterpretError, KfcError, VerifyError
from kfc.ir import ALL, Builder, DType, parse_ir, print_ir, verify
from kfc.ir.func import FuncOp
from kfc.ir.gpu_ops import LaunchOp, ThreadReduceOp
from kfc.ir.interpreter import run
from kfc.ir.rewrite import rebuild
from kfc.ir.specialize import specialize
from kfc.ir.tile_ops import (
    BINARY_CLASSES,
    UNARY_CLASSES,
    BinaryOp,
    BroadcastOp,
    CastOp,
    ConstOp,
    ForOp,
    LoadOp,
    ParallelOp,
    ReduceKind,
    ReduceOp,
    StoreOp,
)
from kfc.ir.types import tensor
from kfc.passes import (
    PASSES,
    ROW_PIPELINE,
    Pass,
    PassError,
    Pipeline,
    VerifyEach,
    parse_pipeline,
    register_pass,
)
import kfc.passes.manager as manager
from kfc.passes.base import format_option, option_range
from kfc.passes.rewriter import PatternRewriter, RewritePattern, RewriteStats, apply_patterns_greedily
from kfc.passes.tile import choose
from kfc.model.target import parse_target
from tests.pipelines import kernel, ops_of, run_pipeline

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def registered(cls):
    """Register a test pass for the duration of a block, then take it out of the registry."""
    register_pass(cls)
    try:
        yield cls
    finally:
        PASSES.pop(cls.NAME, None)


def make_pass(prefix: str, run_fn, requires=frozenset()):
    """A test pass with a unique name whose run() is `run_fn(func, ctx)`."""
    name = f"test-{prefix}-{uuid.uuid4().hex[:8]}"

    @attrs.frozen
    class TestPass(Pass):
        NAME: ClassVar[str] = name
        SUMMARY: ClassVar[str] = f"test pass {prefix}"
        REQUIRES: ClassVar[frozenset] = frozenset(requires)

        def run(self, func, ctx):
            return run_fn(func, ctx)

    return TestPass


def op_names(func: FuncOp) -> list[str]:
    return [op.NAME for op in func.walk()]


def loop_body(func: FuncOp):
    (loop,) = [op for op in func.body.ops if isinstance(op, (ParallelOp, LaunchOp))]
    return loop.body


def random_args(func: FuncOp, seed: int, special=()):
    """Random inputs for every tensor input of `func` (static shapes); `special` values are
    sprinkled in (e.g. -0.0)."""
    rng = np.random.default_rng(seed)
    args = {}
    for v in func.tensor_inputs:
        t = v.ttype
        shape = tuple(int(d) for d in t.shape)
        if t.dtype.is_float:
            a = np.asarray(rng.standard_normal(shape) * 3)
            flat = a.reshape(-1)
            for i, s in enumerate(special):
                if i < flat.size:
                    flat[i] = s
            args[v.name] = a.astype(t.dtype.np)
        else:
            args[v.name] = np.asarray(rng.integers(-50, 50, size=shape)).astype(t.dtype.np)
    return args


def assert_same_results(f: FuncOp, g: FuncOp, seeds=(0, 1, 2), special=()):
    """f and g compute bit-identical outputs on random inputs."""
    for seed in seeds:
        args = random_args(f, seed, special)
        a = run(f, {k: v.copy() for k, v in args.items()})
        b = run(g, {k: v.copy() for k, v in args.items()})
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
            assert a[k].tobytes() == b[k].tobytes(), f"output {k} differs (seed {seed}):\n{a[k]}\n{b[k]}"


def rows_func(body, in_dtype=DType.F32, out_dtype=None, n=8, m=4, extra_inputs=()):
    """A function `f(x: in_dtype[m, n], extras...) -> (y: out_dtype[m, n])` whose row loop body
    is built by `body(b, xr, extras) -> value to store` (xr is the loaded row)."""
    out_dtype = out_dtype or in_dtype
    b = Builder()
    inputs = [("x", tensor(in_dtype, m, n))] + list(extra_inputs)
    with b.func("f", inputs=inputs, outputs=[("y", tensor(out_dtype, m, n))]) as f:
        x, *extras, y = f.args
        with b.parallel([(0, m)]) as (i,):
            xr = b.load(x, [i, ALL])
            b.store(body(b, xr, extras), y, [i, ALL])
    return verify(f.op)


# ---------------------------------------------------------------------------------------------
# 1. pipeline strings


@pytest.mark.parametrize("text", [
    "canonicalize,tile{rows=2,vec=8},lower-ptx{approx=off}",
    "canonicalize",
    "",
    ROW_PIPELINE,
    "tile{rows=4,threads=64,vec=2,cluster=2,persistent=true},lower-reductions,lower-ptx{approx=on,stream=nc_na,store=lu}",
    "canonicalize{max_iterations=3},cse,dce,cse",
])
def test_canonical_pipeline_round_trips(text):
    p = parse_pipeline(text)
    assert str(p) == text
    assert parse_pipeline(str(p)) == p
    names = re.sub(r"\{[^}]*\}", "", text).split(",") if text else []
    assert [q.NAME for q in p] == names


def test_parsed_options_have_their_types():
    p = parse_pipeline("tile{rows=2,vec=8,persistent=true},lower-ptx{approx=off},canonicalize{max_iterations=3}")
    tile, ptx, canon = p.passes
    assert (tile.NAME, tile.rows, tile.vec, tile.threads, tile.persistent) == ("tile", 2, 8, 0, True)
    assert isinstance(tile.rows, int) and tile.persistent is True
    assert format_option(ptx.approx) == "off" and format_option(ptx.stream) == "cs"
    assert canon.max_iterations == 3


@pytest.mark.parametrize("text, canonical", [
    ("  canonicalize , tile { rows = 2 , vec = 8 } ,lower-ptx{ approx=off }  ",
     "canonicalize,tile{rows=2,vec=8},lower-ptx{approx=off}"),
    ("tile{vec=8,rows=2}", "tile{rows=2,vec=8}"),            # declaration order
    ("tile{rows=0,vec=0,persistent=false}", "tile"),           # defaults dropped
    ("lower-ptx{approx=auto,stream=cs,store=cs}", "lower-ptx"),
    ("canonicalize{max_iterations=16}", "canonicalize"),
    ("cse{}", "cse"),
    ("tile{rows=02}", "tile{rows=2}"),
    ("\tdce\n", "dce"),
])
def test_non_canonical_text_prints_canonically(text, canonical):
    p = parse_pipeline(text)
    assert str(p) == canonical
    assert parse_pipeline(canonical) == p


def _pass_error(text) -> PassError:
    with pytest.raises(PassError) as info:
        parse_pipeline(text)
    return info.value


@pytest.mark.parametrize("text, suggestion", [
    ("canonicalise", "canonicalize"),
    ("lower-reductons", "lower-reductions"),
    ("lower-ptz", "lower-ptx"),
    ("fuse-reduction", "fuse-reductions"),
    ("tiel", "tile"),
])
def test_unknown_pass_suggests_the_closest(text, suggestion):
    e = _pass_error(f"cse,{text},dce")
    assert e.message == f"unknown pass {text!r}"
    assert f"did you mean {suggestion}?" in e.hint and "kfc passes" in e.hint
    assert f"did you mean {suggestion}?" in str(e)


def test_unknown_pass_without_a_close_name_suggests_nothing():
    e = _pass_error("frobnicate")
    assert "unknown pass 'frobnicate'" in e.message and "did you mean" not in e.hint and "kfc passes" in e.hint


@pytest.mark.parametrize("text, words", [
    ("tile{rowz=2}", ["tile has no option 'rowz'", "rows, threads, vec, cluster, persistent"]),
    ("lower-reductions{kind=sum}", ["lower-reductions has no option 'kind'", "none"]),
    ("tile{rows=two}", ["bad value 'two'", "tile's option rows", "int", "not a whole number", "rows takes"]),
    ("tile{threads=abc}", ["not a whole number", "threads takes 0|1|2|4"]),
    ("tile{rows=2.5}", ["bad value '2.5'", "rows", "int"]),
    ("tile{persistent=yes}", ["bad value 'yes'", "persistent", "bool", "true or false"]),
    ("tile{persistent=1}", ["bad value '1'", "persistent", "true or false"]),
    ("canonicalize{max_iterations=many}", ["bad value 'many'", "max_iterations", "int"]),
    ("tile{rows=2,rows=4}", ["option rows given twice for pass tile"]),
    ("tile{rows=2,vec=8,rows=2}", ["option rows given twice"]),
    ("canonicalize,", ["ends with a comma"]),
    ("canonicalize,cse, ", ["ends with a comma"]),
    ("canonicalize,,cse", ["bad pipeline at column 14"]),
    (",cse", ["bad pipeline at column 1"]),
    ("tile{rows=2,}", ["bad option '' for pass tile", "key=value"]),
    ("tile{rows}", ["bad option 'rows'", "key=value"]),
    ("tile{=2}", ["bad option '=2'"]),
    ("tile{rows=2", ["bad pipeline at column 5", "a brace that never closes", 'close it: "tile{']),
    ("tile}", ["bad pipeline at column 5", "a closing brace with none open"]),
    ("tile{rows=2}}", ["bad pipeline at column 13", "a closing brace with none open"]),
    ("canonicalize cse", ["bad pipeline at column 14", "expected ','"]),
    ("%%%", ["bad pipeline at column 1", "'%%%'"]),
    ("canonicalize;cse", ["bad pipeline at column 13"]),
])
def test_bad_pipelines_raise_a_clear_pass_error(text, words):
    e = _pass_error(text)
    rendered = str(e)
    for w in words:
        assert w in rendered, f"{w!r} not in {rendered!r}"
    assert "Traceback" not in rendered


class _Mode(enum.Enum):
    FAST = "fast"
    EXACT = "exact"


def test_enum_options_convert_and_reject_bad_values():
    @attrs.frozen
    class EnumPass(Pass):
        NAME: ClassVar[str] = f"test-enum-{uuid.uuid4().hex[:8]}"
        mode: _Mode = _Mode.FAST

    with registered(EnumPass):
        p = parse_pipeline(f"{EnumPass.NAME}{{mode=exact}}")
        assert p.passes[0].mode is _Mode.EXACT
        assert str(p) == f"{EnumPass.NAME}{{mode=exact}}"
        assert str(parse_pipeline(f"{EnumPass.NAME}{{mode=fast}}")) == EnumPass.NAME
        e = _pass_error(f"{EnumPass.NAME}{{mode=slow}}")
        assert "bad value 'slow'" in e.message and "fast, exact" in e.message


def test_enum_options_with_postponed_annotations_are_validated():
    @attrs.frozen
    class EnumPass(Pass):
        NAME: ClassVar[str] = f"test-enum-{uuid.uuid4().hex[:8]}"
        mode: "_Mode" = _Mode.FAST

    with registered(EnumPass):
        assert parse_pipeline(f"{EnumPass.NAME}{{mode=exact}}").passes[0].mode is _Mode.EXACT
        _pass_error(f"{EnumPass.NAME}{{mode=slow}}")


@pytest.mark.parametrize("text", ["lower-ptx{approx=bogus}", "lower-ptx{stream=bogus}"])
def test_lower_ptx_option_values_are_checked_when_parsing(text):
    _pass_error(text)


def _option_values(field):
    """Values an option declares it takes (kfc.passes.base.option)."""
    allowed = option_range(field)
    assert allowed is not None, f"option {field.name} declares no allowed values"
    listed = allowed.values()
    if listed is not None:
        return st.sampled_from(listed)
    return st.integers(allowed.lo, allowed.hi if allowed.hi is not None else allowed.lo + (1 << 20))


@st.composite
def _passes(draw):
    name = draw(st.sampled_from(sorted(n for n in PASSES if not n.startswith("test-"))))
    cls = PASSES[name]
    kwargs = {}
    for field in attrs.fields(cls):
        if draw(st.booleans()):
            kwargs[field.name] = draw(_option_values(field))
    return cls(**kwargs)


def _spaced(draw, text: str) -> str:
    """Insert optional whitespace at the places the grammar allows it."""
    out = []
    for ch in text:
        if ch in ",{}=":
            out.append(draw(st.sampled_from(["", " ", "  "])) + ch + draw(st.sampled_from(["", " ", "\t"])))
        else:
            out.append(ch)
    return "".join(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(_passes(), max_size=8), st.data())
def test_random_pipelines_print_parse_print(passes, data):
    pipe = Pipeline(tuple(passes))
    text = str(pipe)
    parsed = parse_pipeline(text)
    assert parsed == pipe
    assert str(parsed) == text
    # the same pipeline written with spaces (and every option spelled out) reads back the same
    spelled = ",".join(
        p.NAME + ("{" + ",".join(f"{k}={_fmt(v)}" for k, v in p.options().items()) + "}" if p.options() else "")
        for p in passes)
    assert str(parse_pipeline(_spaced(data.draw, spelled))) == text


def _fmt(v):
    return format_option(v)


def test_every_registered_pass_has_a_name_summary_and_default_construction():
    assert {"canonicalize", "cse", "dce", "tile", "lower-reductions", "fuse-reductions", "lower-ptx"} <= set(PASSES)
    for name, cls in PASSES.items():
        assert cls.NAME == name and cls.SUMMARY
        if all(f.default is not attrs.NOTHING for f in attrs.fields(cls)):
            assert str(cls()) == name and parse_pipeline(name) == Pipeline((cls(),))


# ---------------------------------------------------------------------------------------------
# 2. the greedy rewriter


def _sub_chain():
    """y = (x - w) - 2.0 over rows of f32[8]."""
    return rows_func(lambda b, xr, ex: b.binary("sub", b.binary("sub", xr, b.load(ex[0], [ALL])), 2.0),
                     extra_inputs=[("w", tensor(DType.F32, 8))])


class SubToAddNeg(RewritePattern):
    ROOT = BINARY_CLASSES["sub"]

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        a, b = op.operands
        neg = rw.create(UNARY_CLASSES["neg"], [b])
        add = rw.create(BINARY_CLASSES["add"], [a, neg.result])
        return rw.replace([add.result])


def test_greedy_driver_reaches_a_fixpoint():
    f = _sub_chain()
    assert op_names(f).count("tile.sub") == 2
    stats = RewriteStats()
    g = verify(apply_patterns_greedily(f, [SubToAddNeg()], stats=stats))
    names = op_names(g)
    assert "tile.sub" not in names and names.count("tile.neg") == 2 and names.count("tile.add") == 2
    assert stats.applied["SubToAddNeg"] == 2
    assert stats.iterations == 2 and stats.converged  # one sweep rewrites, the next finds nothing
    assert_same_results(f, g)  # a - b == a + (-b) exactly
    # the input is never mutated
    assert op_names(f).count("tile.sub") == 2


class CountDown(RewritePattern):
    """An index constant c > 0 becomes c - 1: one step per sweep (created ops are not revisited
    in the sweep that made them)."""

    ROOT = ConstOp

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        if not op.result.ttype.dtype.is_int or op.value <= 0:
            return rw.fail("not a positive integer")
        new = rw.create(ConstOp, [], [op.result.type], value=op.value - 1)
        return rw.replace([new.result])


def _count_down_func(start: int):
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.I32, 1))], outputs=[("y", tensor(DType.I32, 1))]) as f:
        x, y = f.args
        c = b.const(start, DType.I32, (1,))
        b.store(b.binary("add", b.load(x, [ALL]), c), y, [ALL])
    return verify(f.op)


def test_greedy_driver_iterates_until_nothing_changes():
    stats = RewriteStats()
    g = apply_patterns_greedily(_count_down_func(3), [CountDown()], max_iterations=16, stats=stats)
    (c,) = [op for op in g.walk() if isinstance(op, ConstOp)]
    assert c.value == 0
    assert stats.iterations == 4 and stats.converged and stats.applied["CountDown"] == 3
    assert stats.failures[("CountDown", "not a positive integer")] == 1


def test_iteration_cap_marks_not_converged():
    stats = RewriteStats()
    g = apply_patterns_greedily(_count_down_func(10), [CountDown()], max_iterations=4, stats=stats)
    (c,) = [op for op in g.walk() if isinstance(op, ConstOp)]
    assert c.value == 6
    assert stats.iterations == 4 and not stats.converged


class NeverStops(RewritePattern):
    ROOT = UNARY_CLASSES["neg"]

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        return rw.replace([rw.create(UNARY_CLASSES["neg"], list(op.operands)).result])


def test_a_pattern_that_never_stops_hits_the_cap():
    f = rows_func(lambda b, xr, ex: b.unary("neg", xr))
    stats = RewriteStats()
    g = apply_patterns_greedily(f, [NeverStops()], max_iterations=5, stats=stats)
    assert stats.iterations == 5 and stats.converged is False and stats.applied["NeverStops"] == 5
    assert_same_results(f, verify(g))


def test_canonicalize_reports_the_iteration_cap():
    f = rows_func(lambda b, xr, ex: b.binary("mul", xr, 1.0))
    _, ctx = run_pipeline(f, "canonicalize{max_iterations=1}")
    stats = ctx.stats["canonicalize{max_iterations=1}"]
    assert not stats.converged and "iteration cap reached" in dict(ctx.notes)["canonicalize{max_iterations=1}"]
    _, ctx = run_pipeline(f, "canonicalize")
    assert ctx.stats["canonicalize"].converged and "cap" not in dict(ctx.notes)["canonicalize"]


class BuildsThenFails(RewritePattern):
    ROOT = UNARY_CLASSES["neg"]

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        rw.create(UNARY_CLASSES["neg"], list(op.operands))
        return rw.fail("changed my mind")


def test_a_pattern_that_creates_ops_and_then_fails_raises():
    f = rows_func(lambda b, xr, ex: b.unary("neg", xr))
    with pytest.raises(RuntimeError, match="BuildsThenFails created ops and then failed"):
        apply_patterns_greedily(f, [BuildsThenFails()])


def test_a_pattern_bug_inside_a_pass_is_reported_as_a_pass_error():
    p = make_pass("bad-pattern", lambda func, ctx: apply_patterns_greedily(func, [BuildsThenFails()]))
    f = rows_func(lambda b, xr, ex: b.unary("neg", xr))
    with registered(p), pytest.raises(PassError, match=f"pass {p.NAME} failed: RuntimeError: pattern BuildsThenFails"):
        run_pipeline(f, p.NAME)


class MatchesButDoesNothing(RewritePattern):
    ROOT = UNARY_CLASSES["neg"]

    def match_and_rewrite(self, op, rw) -> bool:
        return True


def test_a_pattern_that_matches_without_replacing_raises():
    f = rows_func(lambda b, xr, ex: b.unary("neg", xr))
    with pytest.raises(RuntimeError, match="neither replaced nor erased tile.neg"):
        apply_patterns_greedily(f, [MatchesButDoesNothing()])


def test_replacing_with_the_wrong_number_of_values_raises():
    class TwoValues(RewritePattern):
        ROOT = UNARY_CLASSES["neg"]

        def match_and_rewrite(self, op, rw) -> bool:
            return rw.replace([op.operands[0], op.operands[0]])

    with pytest.raises(ValueError, match="tile.neg has 1 results, replaced with 2"):
        apply_patterns_greedily(rows_func(lambda b, xr, ex: b.unary("neg", xr)), [TwoValues()])


class FailsWithReason(RewritePattern):
    ROOT = BinaryOp

    def match_and_rewrite(self, op, rw) -> bool:
        if rw.defining_op(op.operands[1]) is None:
            return rw.fail("the rhs is a block argument")
        return rw.fail(f"the rhs comes from {rw.defining_op(op.operands[1]).NAME}")


def test_failure_reasons_are_counted_in_the_stats():
    f = _sub_chain()  # sub(x, load w), then sub(_, broadcast 2.0)
    stats = RewriteStats()
    g = apply_patterns_greedily(f, [FailsWithReason()], stats=stats)
    assert g is not None and stats.converged and stats.iterations == 1 and not stats.applied
    assert stats.failures == {("FailsWithReason", "the rhs comes from tile.load"): 1,
                              ("FailsWithReason", "the rhs comes from tile.broadcast"): 1}


def test_canonicalize_records_why_patterns_did_not_apply():
    f = rows_func(lambda b, xr, ex: b.binary("mul", xr, xr))
    _, ctx = run_pipeline(f, "canonicalize")
    failures = ctx.stats["canonicalize"].failures
    assert failures[("NeutralOperand", "no neutral constant operand")] >= 1
    assert failures[("FoldConstants", "an operand is not constant")] >= 1


def test_higher_benefit_patterns_are_tried_first():
    class ToAbs(RewritePattern):
        ROOT = UNARY_CLASSES["neg"]
        BENEFIT = 1

        def match_and_rewrite(self, op, rw) -> bool:
            return rw.replace([rw.create(UNARY_CLASSES["abs"], list(op.operands)).result])

    class ToExp(ToAbs):
        BENEFIT = 5

        def match_and_rewrite(self, op, rw) -> bool:
            return rw.replace([rw.create(UNARY_CLASSES["exp"], list(op.operands)).result])

    f = rows_func(lambda b, xr, ex: b.unary("neg", xr))
    stats = RewriteStats()
    g = apply_patterns_greedily(f, [ToAbs(), ToExp()], stats=stats)
    assert "tile.exp" in op_names(g) and "tile.abs" not in op_names(g)
    assert stats.applied == {"ToExp": 1}


def test_a_pattern_may_erase_an_op():
    class EraseStores(RewritePattern):
        ROOT = StoreOp

        def match_and_rewrite(self, op, rw) -> bool:
            return rw.erase()

    f = rows_func(lambda b, xr, ex: xr)
    g = verify(apply_patterns_greedily(f, [EraseStores()]))
    assert "tile.store" in op_names(f) and "tile.store" not in op_names(g)


# ---------------------------------------------------------------------------------------------
# 3. canonicalize


def _canon(f, special=()):
    g, ctx = run_pipeline(f, "canonicalize")
    assert_same_results(f, g, special=special)
    return g, ctx


def test_identity_cast_and_broadcast_disappear():
    def body(b, xr, ex):
        same = b.create(CastOp, [xr], [xr.type]).result
        same = b.create(BroadcastOp, [same], [same.type]).result
        return b.unary("exp", same)

    f = rows_func(body)
    assert op_names(f).count("tile.cast") == 1 and op_names(f).count("tile.broadcast") == 1
    g, _ = _canon(f)
    assert "tile.cast" not in op_names(g) and "tile.broadcast" not in op_names(g)
    (exp,) = ops_of(g, UNARY_CLASSES["exp"])
    (load,) = ops_of(g, LoadOp)
    assert exp.operands[0] is load.result


def test_real_casts_and_broadcasts_stay():
    f = rows_func(lambda b, xr, ex: b.cast(b.binary("add", b.cast(xr, DType.F32), b.load(ex[0], [])), DType.BF16),
                  in_dtype=DType.BF16, extra_inputs=[("s", tensor(DType.F32))])
    g, _ = _canon(f)
    assert op_names(g).count("tile.cast") == 2 and op_names(g).count("tile.broadcast") == 1


def test_widening_round_trip_disappears():
    def body(b, xr, ex):
        wide = b.create(CastOp, [xr], [xr.ttype.with_dtype(DType.F32)]).result
        return b.create(CastOp, [wide], [xr.type]).result

    f = rows_func(body, in_dtype=DType.BF16)
    g, _ = _canon(f, special=[-0.0, np.inf, -np.inf, np.nan, 3e38])
    (store,) = ops_of(g, StoreOp)
    (load,) = ops_of(g, LoadOp)
    assert store.operands[0] is load.result  # bf16 -> f32 -> bf16 is the identity


def test_narrowing_round_trip_stays():
    def body(b, xr, ex):
        narrow = b.create(CastOp, [xr], [xr.ttype.with_dtype(DType.BF16)]).result
        return b.create(CastOp, [narrow], [xr.type]).result

    f = rows_func(body, in_dtype=DType.F32)
    g, _ = _canon(f)
    (store,) = ops_of(g, StoreOp)
    assert isinstance(_def(g, store.operands[0]), CastOp)
    assert op_names(g).count("tile.cast") == 2
    # and it must stay: dropping it changes the results (f32 -> bf16 rounds)
    (load,) = ops_of(f, LoadOp)
    dropped = rebuild(f, lambda op, vmap: [attrs.evolve(op, operands=(load.result,) + op.operands[1:])]
                      if isinstance(op, StoreOp) else None)
    args = random_args(f, 0)
    assert not np.array_equal(run(f, dict(args))["y"], run(verify(dropped), dict(args))["y"])


def _def(func, v):
    for op in func.walk():
        if v in op.results:
            return op
    return None


def _loop_consts(func):
    return [op.value for op in loop_body(func).ops if isinstance(op, ConstOp)]


def test_constants_fold_through_elementwise_ops():
    def body(b, xr, ex):
        c = b.binary("mul", b.binary("add", b.const(2.0, DType.F32), 3.0), 4.0)        # 20
        c = b.binary("sub", c, b.unary("neg", b.const(1.0, DType.F32)))                  # 21
        c = b.binary("max", c, b.unary("sqrt", b.const(16.0, DType.F32)))                # 21
        k = b.cast(b.binary("div", b.const(7, DType.I32), 2), DType.F32)                 # 3 (floor)
        sel = b.where(b.cmp("lt", b.const(1.0, DType.F32), 2.0), c, k)                   # 21
        return b.binary("add", xr, sel)

    f = rows_func(body)
    g, _ = run_pipeline(f, "canonicalize,dce")
    assert_same_results(f, g)
    names = set(op_names(g))
    for gone in ("tile.mul", "tile.sub", "tile.neg", "tile.max", "tile.sqrt", "tile.div", "tile.cast", "tile.cmp",
                 "tile.where", "tile.broadcast"):
        assert gone not in names, gone
    assert _loop_consts(g) == [21.0]
    (add,) = ops_of(g, BINARY_CLASSES["add"])
    assert isinstance(_def(g, add.operands[1]), ConstOp)


@pytest.mark.parametrize("holds", [True, False])
def test_a_where_on_a_constant_condition_keeps_only_the_branch_it_takes(holds):
    """where(c, a, b) with c constant and a, b not: a or b, and the other branch's work (here an
    exponential, or a square root) left to dce; the results are the interpreter's before and after."""
    def body(b, xr, ex):
        cond = b.cmp("lt", b.const(1.0, DType.F32), 2.0 if holds else 0.5)
        return b.where(cond, b.unary("exp", xr), b.unary("sqrt", b.unary("abs", xr)))

    f = rows_func(body)
    g, _ = run_pipeline(f, "canonicalize,dce")
    assert_same_results(f, g)
    names = set(op_names(g))
    assert "tile.where" not in names
    assert ("tile.exp" in names) == holds and ("tile.sqrt" in names) != holds


def test_folding_uses_the_interpreters_integer_semantics():
    f = rows_func(lambda b, xr, ex: b.binary("add", xr, b.binary("rem", b.const(-7, DType.I32), 3)),
                  in_dtype=DType.I32)
    g, _ = run_pipeline(f, "canonicalize,dce")
    assert_same_results(f, g)
    assert _loop_consts(g) == [2]  # -7 mod 3, as the interpreter (python/numpy) computes it


def test_integer_division_by_zero_is_not_folded():
    f = rows_func(lambda b, xr, ex: b.binary("add", xr, b.binary("div", b.const(7, DType.I32), 0)),
                  in_dtype=DType.I32)
    g, ctx = run_pipeline(f, "canonicalize")
    assert "tile.div" in op_names(g)
    assert ctx.stats["canonicalize"].failures[("FoldConstants", "folding raised ZeroDivisionError")] >= 1
    # the fault is left for run time, where both versions report it the same way
    args = random_args(f, 0)
    for func in (f, g):
        with pytest.raises(InterpretError, match="integer division by zero"):
            run(func, dict(args))
    # control: a non-zero divisor does fold
    h, _ = run_pipeline(rows_func(lambda b, xr, ex: b.binary("add", xr, b.binary("div", b.const(7, DType.I32), 2)),
                                  in_dtype=DType.I32), "canonicalize")
    assert "tile.div" not in op_names(h)


def test_broadcast_of_a_constant_becomes_a_constant_tile():
    f = rows_func(lambda b, xr, ex: b.binary("add", xr, 2.5))
    assert "tile.broadcast" in op_names(f)
    g, _ = run_pipeline(f, "canonicalize,dce")
    assert_same_results(f, g)
    assert "tile.broadcast" not in op_names(g)
    (c,) = [op for op in loop_body(g).ops if isinstance(op, ConstOp)]
    assert c.value == 2.5 and tuple(c.result.ttype.shape) == (8,)


@pytest.mark.parametrize("dtype, fn, neutral", [
    (DType.F32, "mul", 1.0), (DType.BF16, "mul", 1.0), (DType.I32, "mul", 1), (DType.I32, "add", 0),
])
def test_neutral_operands_disappear(dtype, fn, neutral):
    for side in ("right", "left"):
        f = rows_func(lambda b, xr, ex, side=side: b.binary(fn, xr, neutral) if side == "right"
                      else b.binary(fn, neutral, xr), in_dtype=dtype)
        g, _ = run_pipeline(f, "canonicalize,dce")
        assert_same_results(f, g, special=[-0.0, np.nan, np.inf] if dtype.is_float else ())
        assert f"tile.{fn}" not in op_names(g)
        (store,) = ops_of(g, StoreOp)
        (load,) = ops_of(g, LoadOp)
        assert store.operands[0] is load.result


def test_float_add_of_zero_stays():
    f = rows_func(lambda b, xr, ex: b.binary("add", xr, 0.0))
    g, _ = _canon(f, special=[-0.0])
    assert "tile.add" in op_names(g)
    # it has to: -0.0 + 0.0 is +0.0
    args = random_args(f, 0, special=[-0.0])
    assert np.signbit(args["x"][0, 0]) and not np.signbit(run(f, dict(args))["y"][0, 0])


def test_mul_by_other_constants_stays():
    f = rows_func(lambda b, xr, ex: b.binary("mul", xr, 2.0))
    g, _ = _canon(f)
    assert "tile.mul" in op_names(g)


def test_canonicalize_is_exact_on_the_row_kernels():
    for name in ("rmsnorm", "softmax", "layernorm"):
        _, f = kernel(name, 64)
        f = verify(specialize(f, {"M": 3}))
        g, _ = run_pipeline(f, "canonicalize,cse,dce")
        assert_same_results(f, g, seeds=(0,))


# ---------------------------------------------------------------------------------------------
# 4. cse and dce


def test_cse_merges_identical_pure_ops():
    def body(b, xr, ex):
        return b.binary("add", b.unary("exp", xr), b.unary("exp", xr))

    f = rows_func(body)
    g, ctx = run_pipeline(f, "cse")
    assert_same_results(f, g)
    assert op_names(f).count("tile.exp") == 2 and op_names(g).count("tile.exp") == 1
    (add,) = ops_of(g, BINARY_CLASSES["add"])
    assert add.operands[0] is add.operands[1]
    assert dict(ctx.notes)["cse"].startswith("1 duplicate")


def test_cse_keeps_ops_that_differ():
    def body(b, xr, ex):
        lt = b.where(b.cmp("lt", xr, 0.0), xr, 1.0)
        gt = b.where(b.cmp("gt", xr, 0.0), xr, 2.0)
        return b.binary("add", b.binary("add", lt, gt), b.binary("sub", xr, 1.0))

    f = rows_func(body)
    g, _ = run_pipeline(f, "cse")
    assert_same_results(f, g)
    assert op_names(g).count("tile.cmp") == 2 and op_names(g).count("tile.where") == 2
    consts = sorted(op.value for op in ops_of(g, ConstOp) if op.result.ttype.dtype is DType.F32)
    assert consts == [0.0, 1.0, 2.0]  # the two 0.0s and the two 1.0s merged, 2.0 kept


def test_cse_merges_loads_of_an_input_nothing_writes():
    f = rows_func(lambda b, xr, ex: b.binary("add", b.load(ex[0], [ALL]), b.load(ex[0], [ALL])),
                  extra_inputs=[("w", tensor(DType.F32, 8))])
    g, _ = run_pipeline(f, "cse")
    assert len(ops_of(g, LoadOp)) == 2  # x, and w once: kernels take their tensors __restrict__
    assert_same_results(f, g)


def test_cse_keeps_loads_of_memory_the_program_writes():
    """Two reads of the output row with a store between them read different contents."""
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.F32, 4, 8))], outputs=[("y", tensor(DType.F32, 4, 8))]) as f:
        x, y = f.args
        with b.parallel([(0, 4)]) as (i,):
            b.store(b.load(x, [i, ALL]), y, [i, ALL])
            before = b.load(y, [i, ALL])
            b.store(b.binary("add", before, 1.0), y, [i, ALL])
            after = b.load(y, [i, ALL])
            b.store(b.binary("add", before, after), y, [i, ALL])
    f = verify(f.op)
    g, _ = run_pipeline(f, "cse")
    assert len(ops_of(g, LoadOp)) == 3
    assert_same_results(f, g)


def test_cse_keeps_signed_zeros_apart():
    def body(b, xr, ex):
        pos = b.binary("div", xr, 0.0)
        neg = b.binary("div", xr, -0.0)
        return b.binary("sub", pos, neg)   # x/0 - x/-0 = ±inf - ∓inf = ±inf (never nan)

    f = rows_func(body)
    g, _ = run_pipeline(f, "cse")
    assert_same_results(f, g)


def _scoped_func(inner_first: bool):
    """Two tile.parallel loops; an add of the scalar inputs s + t appears at the top level and inside
    the first loop (before it when inner_first is False, after it otherwise)."""
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.F32, 4, 8)), ("s", tensor(DType.F32)), ("t", tensor(DType.F32))],
                outputs=[("y", tensor(DType.F32, 4, 8)), ("z", tensor(DType.F32, 4, 8))]) as f:
        x, s_, t_, y, z = f.args
        s, t = b.load(s_, []), b.load(t_, [])
        outer = None if inner_first else b.binary("add", s, t)
        with b.parallel([(0, 4)]) as (i,):
            inner = b.binary("add", s, t)
            b.store(b.binary("mul", b.load(x, [i, ALL]), inner), y, [i, ALL])
        if inner_first:
            outer = b.binary("add", s, t)
        with b.parallel([(0, 4)]) as (i,):
            b.store(b.binary("sub", b.load(x, [i, ALL]), outer), z, [i, ALL])
    return verify(f.op)


def test_cse_lets_a_loop_reuse_an_outer_value():
    f = _scoped_func(inner_first=False)
    g, _ = run_pipeline(f, "cse")
    assert_same_results(f, g)
    first = next(op for op in g.body.ops if isinstance(op, ParallelOp))
    assert not any(op.NAME == "tile.add" for op in first.body.ops)
    assert [op.NAME for op in g.body.ops].count("tile.add") == 1


def test_cse_never_lets_an_outer_op_reuse_a_loop_value():
    f = _scoped_func(inner_first=True)
    g, _ = run_pipeline(f, "cse")  # the manager verifies: a reuse out of scope would fail here
    assert_same_results(f, g)
    first = next(op for op in g.body.ops if isinstance(op, ParallelOp))
    assert any(op.NAME == "tile.add" for op in first.body.ops)
    assert [op.NAME for op in g.body.ops].count("tile.add") == 1


def test_dce_removes_dead_pure_ops_and_loads_but_keeps_stores():
    def body(b, xr, ex):
        b.unary("exp", b.unary("neg", xr))            # a dead chain: both go (dce repeats)
        b.load(ex[0], [ALL])                           # a dead load
        b.binary("add", xr, 3.0)                       # dead, with a dead broadcast and constant
        return b.unary("abs", xr)

    f = rows_func(body, extra_inputs=[("w", tensor(DType.F32, 8))])
    g, ctx = run_pipeline(f, "dce")
    assert_same_results(f, g)
    assert [op.NAME for op in loop_body(g).ops] == ["tile.load", "tile.abs", "tile.store"]
    assert dict(ctx.notes)["dce"] == "6 dead op(s) removed"


def _for_func(store_inside: bool):
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.F32, 4))], outputs=[("y", tensor(DType.F32, 4))]) as f:
        x, y = f.args
        with b.for_(0, 4, 1, [b.const(0.0, DType.F32)]) as lf:
            acc = b.binary("add", lf.carried[0], b.load(x, [lf.iv]))
            if store_inside:
                b.store(acc, y, [lf.iv])
            lf.yield_([acc])
        if not store_inside:  # the loop's result is unused either way
            b.store(b.load(x, [ALL]), y, [ALL])
    return verify(f.op)


def test_dce_removes_a_dead_loop_without_effects():
    f = _for_func(store_inside=False)
    g, _ = run_pipeline(f, "dce")
    assert_same_results(f, g)
    assert "tile.for" in op_names(f) and "tile.for" not in op_names(g)
    assert "tile.store" in op_names(g)


def test_dce_keeps_a_loop_that_stores():
    f = _for_func(store_inside=True)
    g, _ = run_pipeline(f, "dce")
    assert_same_results(f, g)
    (loop,) = ops_of(g, ForOp)
    assert not any(True for op in g.walk() for v in op.operands if v is loop.results[0])  # result unused
    assert "tile.store" in [op.NAME for op in loop.body.ops]


def test_dce_removes_a_parallel_loop_without_stores():
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.F32, 4, 8))], outputs=[("y", tensor(DType.F32, 4, 8))]) as f:
        x, y = f.args
        with b.parallel([(0, 4)]) as (i,):
            b.unary("exp", b.load(x, [i, ALL]))
        with b.parallel([(0, 4)]) as (i,):
            b.store(b.load(x, [i, ALL]), y, [i, ALL])
    f = verify(f.op)
    g, _ = run_pipeline(f, "dce")
    assert len(ops_of(g, ParallelOp)) == 1


@pytest.fixture(scope="module")
def _programs():
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import strategies
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return strategies


def test_local_passes_preserve_results_on_random_programs(_programs):
    from kfc.check.runner import draw_inputs

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(_programs.programs_and_sizes())
    def prop(fs):
        func, sizes = fs
        args = draw_inputs(func, None, sizes, np.random.default_rng(0))

        def fresh():
            return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}

        try:
            with np.errstate(all="ignore"):
                ref = run(func, fresh(), sizes)
        except KfcError:
            assume(False)
        g, _ = run_pipeline(func, "canonicalize,cse,dce")
        with np.errstate(all="ignore"):
            got = run(g, fresh(), sizes)
        for k in ref:
            assert ref[k].tobytes() == got[k].tobytes(), k

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        prop()


# ---------------------------------------------------------------------------------------------
# 5. --verify-each, and a broken pass it must catch


@pytest.mark.parametrize("n", [7, 256, 4095, 65536])
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm"])
def test_row_pipeline_passes_verify_each(name, n):
    spec, f = kernel(name, n)
    ve = VerifyEach({"N": n, "M": 3}, spec.check, seeds=(0, 1))
    g, ctx = run_pipeline(f, ROW_PIPELINE, check=spec.check, verify_each=ve)
    assert [p for p, _ in ctx.timings] == ROW_PIPELINE.split(",")
    assert len(ops_of(g, LaunchOp)) == 1 and not ops_of(g, ParallelOp) and not ops_of(g, ReduceOp)
    assert ops_of(g, ThreadReduceOp)
    assert any(op.NAME.startswith("ptx.st") for op in g.walk())


@pytest.mark.parametrize("approx", ["on", "off"])
def test_lower_ptx_divides_by_a_row_shared_value_through_its_reciprocal(approx):
    """softmax's e / sum(e): with approx, each element is multiplied by one reciprocal the row
    takes once (a scalar division of 1 by the sum); without it the row keeps its IEEE division.
    Either way the interpreter agrees with the op (--verify-each)."""
    spec, f = kernel("softmax", 4096)
    ve = VerifyEach({"N": 4096, "M": 3}, spec.check, seeds=(0,))
    g, ctx = run_pipeline(f, f"canonicalize,tile,lower-reductions,lower-ptx{{approx={approx}}}", check=spec.check,
                          verify_each=ve)
    divs = [op for op in g.walk() if op.NAME == "tile.div"]
    ranks = sorted(d.result.ttype.rank for d in divs)
    if approx == "off":
        assert ranks == [1]
    else:
        assert ranks == [0]
        one = next(op for op in g.walk() if op.results and op.results[0] is divs[0].operands[0])
        assert one.NAME == "tile.const" and one.value == 1.0
        assert any(op.NAME == "tile.broadcast" and op.operands[0] is divs[0].result for op in g.walk())
    assert any(p.startswith("lower-ptx") and "approximate functions" in m for p, m in ctx.notes)


def _swap_ops(func, pick, make):
    """Rebuild func, replacing each op `pick` selects with `make(op)`."""
    return rebuild(func, lambda op, vmap: [make(op)] if pick(op) else None)


def _add_to_sub(func, ctx):
    sub = BINARY_CLASSES["sub"]
    return _swap_ops(func, lambda op: op.NAME == "tile.add",
                     lambda op: sub(operands=op.operands, results=op.results, loc=op.loc))


def _mean_to_sum(func, ctx):
    return _swap_ops(func, lambda op: isinstance(op, ReduceOp) and op.kind is ReduceKind.MEAN,
                     lambda op: attrs.evolve(op, kind=ReduceKind.SUM))


def _warp_sum_to_max(func, ctx):
    return _swap_ops(func, lambda op: op.NAME == "gpu.warp_reduce" and op.kind is ReduceKind.SUM,
                     lambda op: attrs.evolve(op, kind=ReduceKind.MAX))


def _warp_pair_swapped(func, ctx):
    return _swap_ops(func, lambda op: op.NAME == "gpu.warp_max_sumexp",
                     lambda op: attrs.evolve(op, operands=op.operands[::-1]))


def _the_store(func):
    (store,) = ops_of(func, StoreOp)
    return store


@pytest.mark.parametrize("name, broken, where", [
    ("layernorm", _add_to_sub, "after canonicalize"),          # `+ b` and `+ eps` become subtractions
    ("rmsnorm", _mean_to_sum, "on the tiled loop"),            # mean(x²) becomes sum(x²)
    ("layernorm", _warp_sum_to_max, "on the lowered reductions"),  # the warp shuffle sum becomes a max
    ("softmax", _warp_sum_to_max, "on the lowered reductions"),  # the warp shuffle sum becomes a max
    ("softmax", _warp_pair_swapped, "on the lowered pair"),  # online softmax's (max, sum) halves mixed up
])
def test_verify_each_rejects_a_broken_pass(name, broken, where):
    spec, f = kernel(name, 256)
    p = make_pass("broken", broken)
    position = {"after canonicalize": "canonicalize,{},cse,dce,tile",
                "on the tiled loop": "canonicalize,tile,{},lower-reductions",
                "on the lowered reductions": "canonicalize,tile,lower-reductions,{},lower-ptx",
                "on the lowered pair": "canonicalize,online-softmax,tile,lower-reductions,{},lower-ptx"}[where]
    text = position.format(p.NAME)
    store = _the_store(f)
    assert store.loc is not None and store.loc.file == f"kernels/{name}.kfc"
    with registered(p):
        ve = VerifyEach({"N": 256, "M": 3}, spec.check)
        with pytest.raises(PassError) as info:
            run_pipeline(f, text, check=spec.check, verify_each=ve)
        e = info.value
        assert e.message.startswith(f"pass {p.NAME} changed the results: output y differs at [")
        assert f"written by tile.store at {store.loc}" in e.message
        assert e.span == store.loc and f"the pass {p.NAME} is wrong" in e.hint
        assert str(store.loc) in str(e) and "y[m, :] = " in str(e)  # rendered with the source line

        # without --verify-each nothing stops it: the IR verifies, the pipeline completes ...
        g, ctx = run_pipeline(f, text, check=spec.check)
        verify(g)
        assert p.NAME in [n for n, _ in ctx.timings]
        # ... and the results are wrong, which only the interpreter check saw
        m = specialize(f, {"M": 3})
        args = random_args(m, 0)
        good = run(m, dict(args))["y"].astype(np.float64)
        bad = run(specialize(g, {"M": 3}), dict(args))["y"].astype(np.float64)
        assert not np.allclose(good, bad, rtol=1e-2, atol=1e-2)


def test_verify_each_interprets_each_function_once(monkeypatch):
    """A pass's input is the previous pass's output: its results on the same inputs come from that
    pass's check, so n passes cost n + 1 runs of the interpreter per seed, not 2n, and a broken
    pass late in the pipeline is still caught against the results before it."""
    spec, f = kernel("rmsnorm", 256)
    runs = []
    real = manager.run_tracked
    monkeypatch.setattr(manager, "run_tracked", lambda func, *a, **k: runs.append(func) or real(func, *a, **k))
    text = "canonicalize,cse,dce,tile,lower-reductions"
    run_pipeline(f, text, check=spec.check, verify_each=VerifyEach({"N": 256, "M": 3}, spec.check, seeds=(0, 1)))
    assert len(runs) == 2 * (len(text.split(",")) + 1)

    p = make_pass("broken", _warp_sum_to_max)
    runs.clear()
    with registered(p), pytest.raises(PassError, match=f"pass {p.NAME} changed the results: output y differs"):
        run_pipeline(f, f"{text},{p.NAME}", check=spec.check, verify_each=VerifyEach({"N": 256, "M": 3}, spec.check))
    assert len(runs) == len(text.split(",")) + 2


def test_verify_each_names_an_unwritten_element():
    spec, f = kernel("softmax", 256)
    p = make_pass("drops-stores", lambda func, ctx: rebuild(func, lambda op, vmap: [] if isinstance(op, StoreOp)
                                                           else None))
    with registered(p), pytest.raises(PassError, match=f"pass {p.NAME} changed the results: output y differs at "
                                                     "\\[0, 0\\].*written by an element no op wrote"):
        run_pipeline(f, f"canonicalize,{p.NAME}", check=spec.check, verify_each=VerifyEach({"M": 2}, spec.check))


def test_verify_each_names_the_store_for_small_outputs():
    f = rows_func(lambda b, xr, ex: b.binary("mul", xr, 1e-7))
    p = make_pass("scales", lambda func, ctx: _swap_ops(func, lambda op: isinstance(op, ConstOp) and op.value == 1e-7,
                                                        lambda op: attrs.evolve(op, value=2e-7)))
    with registered(p), pytest.raises(PassError) as info:
        run_pipeline(f, p.NAME, verify_each=VerifyEach({}))
    assert "differs at [0, 0]" in info.value.message and "written by tile.store" in info.value.message


def test_the_verifier_rejects_a_pass_that_breaks_the_ir():
    def breaks(func, ctx):  # tile.abs now claims an f64 result from an f32 operand
        return _swap_ops(func, lambda op: op.NAME == "tile.abs", lambda op: attrs.evolve(
            op, results=(type(op.result)(op.result.ttype.with_dtype(DType.F64)),)))

    p = make_pass("ill-typed", breaks)
    f = rows_func(lambda b, xr, ex: b.unary("abs", xr))
    with registered(p), pytest.raises(VerifyError, match=f"after pass {p.NAME}: "):
        run_pipeline(f, p.NAME)


def test_a_crashing_pass_is_named():
    def crash(func, ctx):
        raise ZeroDivisionError("oops")

    p = make_pass("crash", crash)
    with registered(p), pytest.raises(PassError, match=f"pass {p.NAME} failed: ZeroDivisionError: oops") as info:
        run_pipeline(rows_func(lambda b, xr, ex: xr), p.NAME)
    assert "KFC_DEBUG" in info.value.hint


# ---------------------------------------------------------------------------------------------
# 6. target gating


def _recorder():
    ran = []

    def record(func, ctx):
        ran.append(True)
        return func

    return make_pass("recorder", record), ran


@pytest.mark.parametrize("feature, target, family, hint_word", [
    ("wgmma", "sm_100a", "Blackwell", "tcgen05"),
    ("tcgen05", "sm_90a", "Hopper", "wgmma"),
    ("tcgen05", "sm_90", "Hopper", "wgmma"),
])
def test_a_pass_needing_a_missing_feature_fails_before_any_pass_runs(feature, target, family, hint_word):
    rec, ran = _recorder()
    needy = make_pass(f"needs-{feature}", lambda func, ctx: func, requires={feature})
    with registered(rec), registered(needy), pytest.raises(PassError) as info:
        run_pipeline(rows_func(lambda b, xr, ex: xr), f"{rec.NAME},canonicalize,{needy.NAME}", parse_target(target))
    e = info.value
    assert e.message == f"pass {needy.NAME} needs {feature}, which {target} ({family}) does not have"
    assert hint_word in e.hint
    assert not ran


@pytest.mark.parametrize("feature, target", [("wgmma", "sm_90a"), ("tcgen05", "sm_100a"), ("cluster", "sm_90")])
def test_a_pass_needing_a_present_feature_runs(feature, target):
    rec, ran = _recorder()
    needy = make_pass(f"needs-{feature}", lambda func, ctx: func, requires={feature})
    with registered(rec), registered(needy):
        run_pipeline(rows_func(lambda b, xr, ex: xr), f"{needy.NAME},{rec.NAME}", parse_target(target))
    assert ran


def test_tile_with_a_cluster_is_fine_on_sm_90():
    p = parse_pipeline("tile{cluster=2}")
    assert p.passes[0].required_features() == {"cluster", "dsmem", "mbarrier"}
    assert parse_pipeline("tile").passes[0].required_features() == frozenset()
    spec, f = kernel("rmsnorm", 4096)
    g, _ = run_pipeline(f, "canonicalize,tile{cluster=2},lower-reductions", parse_target("sm_90"),
                          check=spec.check, verify_each=VerifyEach({"M": 2}, spec.check))
    (launch,) = ops_of(g, LaunchOp)
    assert launch.cluster == 2 and launch.rows_per_cta == 1
    assert "gpu.cluster_reduce" in op_names(g)


@pytest.mark.parametrize("text", ["sm_80", "sm_91", "sm_100b", "hopper", ""])
def test_parse_target_rejects_unknown_targets(text):
    with pytest.raises(KfcError) as info:
        parse_target(text)
    assert info.value.message == f"unknown target {text!r}"
    assert "sm_90, sm_90a, sm_100, sm_100a" in info.value.hint


@pytest.mark.parametrize("text, sm, a", [("sm_90", 90, False), ("sm_90a", 90, True), (" SM_100A ", 100, True),
                                         ("sm_100", 100, False)])
def test_parse_target_accepts_the_known_ones(text, sm, a):
    t = parse_target(text)
    assert (t.sm, t.arch_specific) == (sm, a) and str(t) == text.strip().lower()


def test_target_features():
    assert parse_target("sm_90a").has("wgmma") and not parse_target("sm_90a").has("tcgen05")
    assert parse_target("sm_100a").has("tcgen05") and not parse_target("sm_100a").has("wgmma")
    for t in ("sm_90", "sm_100a"):
        assert {"cluster", "tma", "mbarrier"} <= parse_target(t).features()


# ---------------------------------------------------------------------------------------------
# 7. the tile pass's choices

NS = [1, 7, 256, 4095, 4096, 65536, 262144]


def _valid(n, rows, threads, vec, cluster):
    return {
        "vec divides N": n % vec == 0,
        "threads a power of two": threads >= 1 and threads & (threads - 1) == 0,
        "threads <= 1024": threads <= 1024,
        "rows >= 1": rows >= 1,
        "rows*threads <= 1024": rows * threads <= 1024,
        "rows*threads whole warps": (rows * threads) % 32 == 0,
        "cluster a power of two <= 16": 1 <= cluster <= 16 and cluster & (cluster - 1) == 0,
        "cluster > 1 -> rows = 1": cluster == 1 or rows == 1,
    }


@pytest.mark.parametrize("has_cluster", [True, False])
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("n", NS)
def test_tile_chooses_valid_configs(n, itemsize, has_cluster):
    rows, threads, vec, cluster = choose(n, itemsize, 0, 0, 0, 0, has_cluster)
    bad = [k for k, ok in _valid(n, rows, threads, vec, cluster).items() if not ok]
    assert not bad, (rows, threads, vec, cluster, bad)
    assert vec <= max(1, 16 // itemsize)  # at most 16-byte accesses
    if not has_cluster:
        assert cluster == 1


def test_tile_choices_scale_with_the_row():
    # rows that fit one CTA get one; the longest take a cluster on a target that has them
    assert choose(4096, 2, 0, 0, 0, 0, True)[3] == 1
    assert choose(262144, 2, 0, 0, 0, 0, True)[3] > 1
    assert choose(262144, 2, 0, 0, 0, 0, False)[3] == 1
    assert choose(256, 2, 0, 0, 0, 0, True) == (8, 32, 8, 1)   # several short rows per CTA
    assert choose(7, 2, 0, 0, 0, 0, True)[2] == 1              # odd rows: scalar accesses


@pytest.mark.parametrize("n, vec, expect", [(4095, 8, 1), (4100, 16, 4), (4096, 16, 16), (6, 8, 2), (1, 4, 1),
                                            (262144, 2, 2)])
def test_explicit_vec_is_halved_until_it_divides_n(n, vec, expect):
    assert choose(n, 2, 0, 0, vec, 0, True)[2] == expect


@pytest.mark.parametrize("rows, threads, cluster, expect_rows", [
    (64, 32, 0, 32),     # clamped to 1024 threads per CTA
    (4, 256, 0, 4),
    (8, 1024, 0, 1),
    (4, 0, 2, 1),        # a cluster holds one row per CTA
    (1, 8, 0, 4),        # rows of 8 threads: at least a warp per CTA
])
def test_explicit_rows_are_fitted(rows, threads, cluster, expect_rows):
    r, t, v, c = choose(4096, 2, rows, threads, 0, cluster, True)
    assert r == expect_rows
    assert not [k for k, ok in _valid(4096, r, t, v, c).items() if not ok]


@pytest.mark.parametrize("n, rows, threads, cluster", [(4096, 3, 16, 0), (7, 0, 0, 2)])
def test_explicit_options_are_fitted_to_a_valid_launch(n, rows, threads, cluster):
    r, t, v, c = choose(n, 2, rows, threads, 0, cluster, True)
    assert not [k for k, ok in _valid(n, r, t, v, c).items() if not ok]


def test_tile_rejects_options_that_cannot_be_fitted():
    _, f = kernel("rmsnorm", 4096)
    with pytest.raises(PassError, match=r"tile: threads=48 is not allowed\nhint: threads takes 0\|1\|2\|4"):
        run_pipeline(f, "tile{threads=48}")
    with pytest.raises(PassError, match=r"tile: threads=2048 is not allowed"):
        run_pipeline(f, "tile{threads=2048}")


def test_tile_applies_its_choice():
    _, f = kernel("softmax", 4095)
    g, ctx = run_pipeline(f, "tile{rows=2,vec=8}")
    (launch,) = ops_of(g, LaunchOp)
    r, t, v, c = choose(4095, 2, 2, 0, 8, 0, True)
    assert (launch.rows_per_cta, launch.threads, launch.vec, launch.cluster) == (r, t, v, c)
    assert (r, v, c) == (2, 1, 1)  # vec 8 does not divide 4095: halved down to 1
    assert dict(ctx.notes)["tile{rows=2,vec=8}"].startswith("row 4095: 2 row(s)/CTA")
    layouts = {v.ttype.layout for op in launch.body.ops for v in op.results
               if v.ttype.rank == 1 and v.ttype.layout is not None}
    assert {(lay.kind, lay.get("threads"), lay.get("vec")) for lay in layouts} == {("row", t, 1)}


# ---------------------------------------------------------------------------------------------
# 8. instrumentation


def test_print_ir_after_all_and_before():
    spec, f = kernel("softmax", 256)
    out = io.StringIO()
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check, print_ir_after_all=True,
                          print_ir_before=frozenset({"cse"}), out=out)
    text = out.getvalue()
    titles = [line for line in text.splitlines() if line.startswith("// -----")]
    expected = []
    for p in ROW_PIPELINE.split(","):
        if p == "cse":
            expected.append("// ----- IR before cse -----")
        expected.append(f"// ----- IR after {p} -----")
    assert titles == expected
    # each section is the IR itself, which reads back; the last one is the result
    chunks = text.split("// ----- ")
    last = chunks[-1].split("\n", 1)[1]
    assert last == print_ir(g)
    after_tile = next(c for c in chunks if c.startswith("IR after tile "))
    assert "gpu.launch" in after_tile and "gpu.launch" not in next(c for c in chunks if c.startswith("IR before cse"))
    for c in chunks[1:]:
        verify(parse_ir(c.split("\n", 1)[1], "printed.kir"))


def test_nothing_is_printed_by_default():
    spec, f = kernel("softmax", 256)
    out = io.StringIO()
    run_pipeline(f, ROW_PIPELINE, check=spec.check, out=out)
    assert out.getvalue() == ""


def test_timing_prints_a_table():
    spec, f = kernel("rmsnorm", 256)
    out = io.StringIO()
    _, ctx = run_pipeline(f, ROW_PIPELINE, check=spec.check, timing=True, out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "pass timing:"
    names = ROW_PIPELINE.split(",")
    assert len(lines) == len(names) + 2
    for line, name in zip(lines[1:], names):
        ms, unit, got = line.split()
        assert unit == "ms" and got == name and float(ms) >= 0
    assert lines[-1].split()[1:] == ["ms", "total"]
    total = float(lines[-1].split()[0])
    assert total == pytest.approx(sum(t for _, t in ctx.timings) * 1e3, abs=0.02)


def _check_dump(d: Path, func_after: FuncOp, names):
    files = sorted(p.name for p in d.iterdir())
    assert files == [f"{i:02d}-{n}.kir" for i, n in enumerate(["input"] + names)]
    for p in sorted(d.iterdir()):
        text = p.read_text()
        assert print_ir(verify(parse_ir(text, p.name))) == text
    assert (d / files[-1]).read_text() == print_ir(func_after)


def test_dump_dir_writes_every_stage(tmp_path):
    spec, f = kernel("layernorm", 256)
    d = tmp_path / "dump"
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check, dump_dir=d)
    _check_dump(d, g, ROW_PIPELINE.split(","))
    assert (d / "00-input.kir").read_text() == print_ir(f)


def test_kfc_dump_dir_from_the_environment(tmp_path, monkeypatch):
    d = tmp_path / "env-dump"
    monkeypatch.setenv("KFC_DUMP_DIR", str(d))
    spec, f = kernel("rmsnorm", 7)
    g, ctx = run_pipeline(f, "canonicalize,tile,lower-reductions", check=spec.check)
    assert ctx.dump_dir == d
    _check_dump(d, g, ["canonicalize", "tile", "lower-reductions"])


def test_dump_dir_keeps_the_input_of_a_failing_pass(tmp_path):
    spec, f = kernel("rmsnorm", 256)
    d = tmp_path / "dump"
    p = make_pass("broken", _mean_to_sum)
    with registered(p), pytest.raises(PassError):
        run_pipeline(f, f"canonicalize,{p.NAME}", check=spec.check, dump_dir=d,
                     verify_each=VerifyEach({"M": 2}, spec.check))
    assert sorted(x.name for x in d.iterdir()) == ["00-input.kir", "01-canonicalize.kir"]


# ---------------------------------------------------------------------------------------------
# 9. the command line


def test_cli_opt_runs_a_pipeline_with_verify_each(capsys):
    rc = main(["opt", "kernels/rmsnorm.kfc", "--shape", "M=4,N=256", "-p", "canonicalize,tile,lower-reductions",
               "--verify-each"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "gpu.launch" in out and "gpu.warp_reduce" in out and "tile.reduce" not in out
    assert print_ir(verify(parse_ir(out, "out.kir"))) == out


def test_cli_opt_with_only_the_row_length(capsys):
    rc = main(["opt", "kernels/rmsnorm.kfc", "--shape", "N=256", "-p", "canonicalize,tile,lower-reductions",
               "--verify-each"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "gpu.launch" in out


def test_cli_opt_prints_ir_after_all_to_stderr(capsys):
    rc = main(["opt", "kernels/softmax.kfc", "--shape", "M=2,N=64", "-p", "canonicalize,tile", "--print-ir-after-all",
               "--timing"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "// ----- IR after canonicalize -----" in err and "// ----- IR after tile -----" in err
    assert "pass timing:" in err and "// -----" not in out and "gpu.launch" in out


def test_cli_passes_lists_every_registered_pass(capsys):
    needy = make_pass("listed", lambda func, ctx: func, requires={"wgmma"})
    with registered(needy):
        assert main(["passes"]) == 0
        out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if line and not line[0].isspace()
              and not line.startswith("default pipeline")}
    assert listed == set(PASSES) | {needy.NAME}
    assert f"{needy.NAME}" in out and "[needs wgmma]" in out
    assert ("options: rows: 0..1024=0, threads: 0|1|2|4|8|16|32|64|128|256|512|1024=0, vec: 0|1|2|4|8|16=0, "
            "cluster: 0|1|2|4|8|16=0, persistent: false|true=false") in out
    assert f"default pipeline for row ops: {ROW_PIPELINE}" in out
    assert main(["passes"]) == 0
    assert needy.NAME not in capsys.readouterr().out  # unregistered again


@pytest.mark.parametrize("pipeline, words", [
    ("canonicalise,tile", ["unknown pass 'canonicalise'", "did you mean canonicalize?"]),
    ("tile{rows=x}", ["bad value 'x'"]),
    ("canonicalize,", ["ends with a comma"]),
])
def test_cli_bad_pipeline_exits_2_without_a_traceback(capsys, pipeline, words):
    rc = main(["opt", "kernels/rmsnorm.kfc", "--shape", "M=4,N=256", "-p", pipeline])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("kfc: error: ") and "Traceback" not in err
    for w in words:
        assert w in err


def test_cli_bad_pipeline_in_a_fresh_process():
    r = subprocess.run([sys.executable, "-m", "kfc.cli", "opt", "kernels/rmsnorm.kfc", "--shape", "M=4,N=256", "-p",
                        "canonicalize,tile{rows=2,rows=3}"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert "option rows given twice for pass tile" in r.stderr and "Traceback" not in r.stderr
