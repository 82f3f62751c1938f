"""The Builder's typing rules: literals adopt the other side's dtype, integers promote (index the
widest), floats never mix silently, shapes broadcast as in numpy (symbolic dims included), dot
contracts matching dims, stores take the tensor's dtype and region shape; and name_value."""

from __future__ import annotations

import re

import pytest

from kfc.diagnostics import Span, VerifyError
from kfc.ir import ALL, Builder, BuildError, Slice, SymDim, print_ir, scalar, tensor, verify
from kfc.ir.dtypes import DType
from kfc.ir.tile_ops import BroadcastOp, CastOp, ConstOp, DotOp, StoreOp

M, N, K = SymDim("M"), SymDim("N"), SymDim("K")
F32, BF16, F16, I8, I32, I64, IDX, BOOL = (DType.F32, DType.BF16, DType.F16, DType.I8, DType.I32, DType.I64,
                                           DType.INDEX, DType.BOOL)


@pytest.fixture
def env():
    """Yields (builder, tile factory) inside a function's parallel loop; what was built there,
    errors and all, must still verify afterwards."""
    b = Builder()
    with b.func("f", inputs=[("x", tensor(F32, M, N, K))], outputs=[]) as f:
        with b.parallel([(0, 1)]):
            def make(dtype, *shape):
                # a const stands in for "some tile of this type"; it has no special typing
                return b.const(1, dtype, shape)
            yield b, make
    verify(f.op)


def words(msg: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9_]+", msg))


# ---------------------------------------------------------------------------------------------
# literals


@pytest.mark.parametrize("dtype", [F32, BF16, F16, DType.F64])
def test_literal_adopts_float_dtype(env, dtype):
    b, make = env
    x = make(dtype, 4, N)
    for lit in (2, 0.5):
        r = b.binary("mul", x, lit)
        assert r.ttype == x.ttype
        const = next(op for op in reversed(b._blocks[-1]) if isinstance(op, ConstOp))
        assert const.result.ttype.dtype is dtype and const.result.ttype.shape == ()
        assert isinstance(const.value, float) and const.value == float(lit)
    # on either side
    assert b.binary("sub", 3, x).ttype == x.ttype


@pytest.mark.parametrize("dtype", [I8, I32, I64, IDX])
def test_literal_adopts_int_dtype(env, dtype):
    b, make = env
    x = make(dtype, 3)
    r = b.binary("add", x, 7)
    assert r.ttype == x.ttype
    const = next(op for op in reversed(b._blocks[-1]) if isinstance(op, ConstOp))
    assert const.result.ttype.dtype is dtype and const.value == 7 and isinstance(const.value, int)
    assert not any(isinstance(op, CastOp) for op in b._blocks[-1])


def test_float_literal_meets_int_is_an_error(env):
    b, make = env
    x = make(I32, 3)
    with pytest.raises(BuildError) as e:
        b.binary("add", x, 0.5)
    assert "0.5" in e.value.message and "i32" in words(e.value.message)


def test_bool_literals(env):
    b, make = env
    m = make(BOOL, 3)
    assert b.binary("and", m, True).ttype == m.ttype
    with pytest.raises(BuildError, match="bool"):
        b.binary("add", make(F32, 3), True)
    with pytest.raises(BuildError, match="bool"):
        b.binary("and", m, 1)


@pytest.mark.parametrize("lit,ok", [(127, True), (-128, True), (128, False), (300, False), (-129, False)])
def test_int_literal_must_fit_its_dtype(lit, ok):
    # the builder adopts the literal's dtype; the verifier rejects a constant that does not fit
    # (the interpreter would otherwise die inside numpy)
    b = Builder()
    with b.func("f", inputs=[("z", tensor(I8, 4))], outputs=[("y", tensor(I8, 4))]) as f:
        z, y = f.args
        with b.parallel([(0, 1)]):
            b.store(b.binary("add", b.load(z, [ALL]), lit), y, [ALL])
    if ok:
        verify(f.op)
    else:
        with pytest.raises(VerifyError, match=f"{lit} does not fit in i8"):
            verify(f.op)


def test_two_literals_default_to_index(env):
    b, _ = env
    r = b.binary("add", 2, 3)
    assert r.ttype.dtype is IDX and r.ttype.shape == ()
    assert b.unary("neg", 4).ttype.dtype is IDX
    with pytest.raises(BuildError):
        b.unary("exp", 4)  # an index is no float


def test_where_of_two_numbers_is_i32_or_f32(env):
    """where(x > 0, 2, 1) is an i32 tile (as iota's default), not an index: an i32 output takes it;
    a float branch makes both f32. Other bare integers (`n = 0`) stay index."""
    b, make = env
    mask = make(BOOL, 4)
    assert b.where(mask, 2, 1).ttype.dtype is I32
    assert b.where(mask, 2, 0.5).ttype.dtype is F32
    assert b.where(mask, 2.0, 1).ttype.dtype is F32
    assert b.where(mask, True, False).ttype.dtype is BOOL
    assert b.literal(0, None).ttype.dtype is IDX


def test_index_is_named_i64_in_messages(env):
    b, make = env
    with pytest.raises(BuildError) as e:
        b.binary("add", make(F32, 4), b.literal(0, None))
    assert "index" not in e.value.message and "i64" in e.value.message and "0.0" in e.value.hint


def test_const_value_checks(env):
    b, _ = env
    c = b.const(3, F32, [2])
    op = b._blocks[-1][-1]
    assert isinstance(op.value, float) and op.result.ttype.shape == (2,)
    with pytest.raises(BuildError, match="2.5"):
        b.const(2.5, I32)
    assert b._blocks[-1][-1] is op or isinstance(b._blocks[-1][-1], ConstOp)
    b.const(4.0, I32)
    assert b._blocks[-1][-1].value == 4 and isinstance(b._blocks[-1][-1].value, int)
    assert c.ttype.dtype is F32


# ---------------------------------------------------------------------------------------------
# integer promotion and float mismatches


@pytest.mark.parametrize("a,c,want", [(I8, I32, I32), (I32, I8, I32), (I32, I64, I64), (I32, IDX, IDX),
                                      (I64, IDX, IDX), (IDX, I8, IDX), (I32, I32, I32)])
def test_int_promotion(env, a, c, want):
    b, make = env
    x, y = make(a, 4), make(c, 4)
    r = b.binary("add", x, y)
    assert r.ttype.dtype is want
    op = b._blocks[-1][-1]
    assert [v.ttype.dtype for v in op.operands] == [want, want]
    casts = [o for o in b._blocks[-1] if isinstance(o, CastOp)]
    assert len(casts) == (0 if a == c else 1)
    if casts:
        assert casts[0].operands[0] is (x if a != want else y)


def test_int_promotion_in_cmp_and_index(env):
    b, make = env
    r = b.cmp("lt", make(I32, 5), b.dim("N"))
    op = b._blocks[-1][-1]
    assert r.ttype.dtype is BOOL and op.operands[0].ttype.dtype is IDX
    # an i32 scalar as an index is cast to index
    i = b.as_index(make(I32))
    assert i.ttype.dtype is IDX and isinstance(b._blocks[-1][-1], CastOp)
    with pytest.raises(BuildError, match="integer"):
        b.as_index(make(F32))
    with pytest.raises(BuildError, match="integer"):
        b.as_index(1.0)


@pytest.mark.parametrize("a,c", [(F32, BF16), (BF16, F16), (F32, DType.F64), (F32, I32), (BF16, I8), (F16, BOOL)])
@pytest.mark.parametrize("what", ["add", "max", "cmp", "where"])
def test_float_dtype_mismatch_names_both(env, a, c, what):
    b, make = env
    x, y = make(a, 4), make(c, 4)
    with pytest.raises(BuildError) as e:
        if what == "cmp":
            b.cmp("lt", x, y)
        elif what == "where":
            b.where(make(BOOL, 4), x, y)
        else:
            b.binary(what, x, y)
    w = words(e.value.message)
    assert str(a) in w and str(c) in w, e.value.message
    assert "mismatch" in e.value.message


def test_mismatch_error_carries_the_span(env):
    b, make = env
    x, y = make(F32, 2), make(BF16, 2)
    span = Span("src.kfc", 3, 7, 3, 12)
    with b.at(span):
        with pytest.raises(BuildError) as e:
            b.binary("add", x, y)
    assert e.value.span == span
    assert e.value.hint  # says how to convert


def test_float_only_and_logical_only_ops(env):
    b, make = env
    with pytest.raises(BuildError, match="i32"):
        b.unary("exp", make(I32, 3))
    with pytest.raises(BuildError, match="f32"):
        b.binary("and", make(F32, 3), make(F32, 3))
    with pytest.raises(BuildError, match="i32"):
        b.binary("pow", make(I32, 3), 2)
    assert b.binary("xor", make(I32, 3), 5).ttype.dtype is I32


# ---------------------------------------------------------------------------------------------
# broadcasting


@pytest.mark.parametrize("sa,sc,want", [
    ((3, 1), (4,), (3, 4)),
    ((), (2, 3), (2, 3)),
    ((5, 1, 7), (1, 6, 1), (5, 6, 7)),
    ((N, 1), (1, K), (N, K)),
    ((M, N), (N,), (M, N)),
    ((1,), (SymDim("N", 1),), (SymDim("N", 1),)),
    ((SymDim("N", -1), 1), (SymDim("N", -1), 4), (SymDim("N", -1), 4)),
    ((1, 1), (1,), (1, 1)),
    ((2, N, 1, K), (N, 3, 1), (2, N, 3, K)),
])
def test_broadcasting(env, sa, sc, want):
    b, make = env
    x, y = make(F32, *sa), make(F32, *sc)
    r = b.binary("add", x, y)
    assert r.ttype.shape == want
    op = b._blocks[-1][-1]
    assert all(v.ttype.shape == want for v in op.operands)
    bcasts = [o for o in b._blocks[-1] if isinstance(o, BroadcastOp)]
    assert len(bcasts) == (sa != want) + (sc != want)   # broadcasts only where needed


@pytest.mark.parametrize("sa,sc", [
    ((3,), (4,)),
    ((N,), (M,)),
    ((N,), (SymDim("N", 1),)),
    ((2, 3), (3, 2)),
    ((N, K), (K, N)),
    ((4, 1), (2, 3, 5)),
])
def test_broadcasting_mismatch(env, sa, sc):
    b, make = env
    x, y = make(F32, *sa), make(F32, *sc)
    with pytest.raises(BuildError) as e:
        b.binary("mul", x, y)
    msg = e.value.message
    assert "shape mismatch" in msg
    for shape in (sa, sc):
        assert "[" + ", ".join(str(d) for d in shape) + "]" in msg, msg


def test_where_broadcasts_all_three(env):
    b, make = env
    r = b.where(make(BOOL, N, 1), make(F32, 1, K), 0.0)
    assert r.ttype.shape == (N, K) and r.ttype.dtype is F32
    op = b._blocks[-1][-1]
    assert [v.ttype for v in op.operands] == [make(BOOL, N, K).ttype, r.ttype, r.ttype]
    with pytest.raises(BuildError, match="bool"):
        b.where(make(F32, 3), make(F32, 3), 1.0)


# ---------------------------------------------------------------------------------------------
# dot


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_dot_types(env, ta, tb):
    b, make = env
    a = make(BF16, *((K, M) if ta else (M, K)))
    c = make(BF16, *((N, K) if tb else (K, N)))
    r = b.dot(a, c, trans_a=ta, trans_b=tb)
    assert r.ttype.shape == (M, N) and r.ttype.dtype is F32
    assert isinstance(b._blocks[-1][-1], DotOp)
    r = b.dot(make(I8, 4, 5), make(I8, 5, 6))
    assert r.ttype.dtype is I32 and r.ttype.shape == (4, 6)


@pytest.mark.parametrize("ta,tb,sa,sc,ka,kb", [
    (False, False, (4, 5), (6, 7), 5, 6),
    (True, False, (4, 5), (5, 7), 4, 5),
    (False, True, (4, 5), (7, 6), 5, 6),
    (False, False, (M, K), (N, K), K, N),
    (False, False, (M, K), (SymDim("K", 1), N), K, SymDim("K", 1)),
])
def test_dot_contraction_mismatch(env, ta, tb, sa, sc, ka, kb):
    b, make = env
    with pytest.raises(BuildError) as e:
        b.dot(make(F32, *sa), make(F32, *sc), trans_a=ta, trans_b=tb)
    msg = e.value.message
    assert "mismatch" in msg and f"contracts {ka} with {kb}" in msg, msg
    assert e.value.hint


def test_dot_other_errors(env):
    b, make = env
    with pytest.raises(BuildError) as e:
        b.dot(make(F32, 4, 5), make(BF16, 5, 6))
    assert {"f32", "bf16"} <= words(e.value.message)
    with pytest.raises(BuildError, match="2-D"):
        b.dot(make(F32, 5), make(F32, 5, 6))


# ---------------------------------------------------------------------------------------------
# stores


def test_store_rules():
    b = Builder()
    with b.func("f", inputs=[("x", tensor(F32, M, N))],
                outputs=[("y", tensor(BF16, M, N)), ("z", tensor(I32, 8))]) as f:
        x, y, z = f.args
        with b.parallel([(0, b.dim("M"))]) as (m,):
            row = b.load(x, [m, ALL])                      # f32[N]
            with pytest.raises(BuildError) as e:
                b.store(row, y, [m, ALL])
            assert {"f32", "bf16"} <= words(e.value.message) and "mismatch" in e.value.message
            with pytest.raises(BuildError) as e:
                b.store(b.cast(b.load(x, [m, Slice(0, 4)]), BF16), y, [m, ALL])   # [4] into [N]
            assert "[4]" in e.value.message and "[N]" in e.value.message
            with pytest.raises(BuildError) as e:
                b.store(b.cast(row, BF16), y, [m, Slice(0, 4)])                   # [N] into [4]
            assert "[N]" in e.value.message and "[4]" in e.value.message
            with pytest.raises(BuildError):
                b.store(row, y, [m, ALL, ALL])                                    # too many indices
            # a scalar broadcasts, a literal takes the tensor's dtype
            n_before = len(b._blocks[-1])
            b.store(b.cast(b.reduce("sum", row), BF16), y, [m, ALL])
            store = b._blocks[-1][-1]
            assert isinstance(store, StoreOp) and store.operands[0].ttype.shape == (N,)
            assert isinstance(b._blocks[-1][-2], BroadcastOp)
            b.store(3, z, [Slice(0, 8)])
            const = b._blocks[-1][-3]
            assert isinstance(const, ConstOp) and const.result.ttype.dtype is I32 and const.value == 3
            with pytest.raises(BuildError):
                b.store(2.5, z, [ALL])
            assert len(b._blocks[-1]) > n_before
    verify(f.op)


def test_load_rules():
    b = Builder()
    with b.func("f", inputs=[("x", tensor(F16, M, N, K)), ("i", scalar(I32))], outputs=[]) as f:
        x, i = f.args
        with b.parallel([(0, 1)]) as (p,):
            v = b.load(x, [p, Slice(i, 16, limit=b.dim("N")), ALL])
            assert v.ttype.shape == (16, K) and v.ttype.dtype is F16
            assert b.load(x, [p]).ttype.shape == (N, K)                 # missing trailing dims mean ':'
            assert b.load(x, [p, 0, 1], other=2).ttype.shape == ()
            assert b._blocks[-1][-1].other == 2.0 and isinstance(b._blocks[-1][-1].other, float)
            with pytest.raises(BuildError, match="positive size"):
                b.load(x, [Slice(0, 0)])
            with pytest.raises(BuildError):
                b.load(x, [p, p, p, p])
            with pytest.raises(BuildError):
                b.load(v, [0])                                            # a tile is not a tensor
            with pytest.raises(BuildError, match="integer"):
                b.load(x, [0.5])
    verify(f.op)


# ---------------------------------------------------------------------------------------------
# other shape rules


def test_reduce_scan_reshape_rules(env):
    b, make = env
    x = make(F32, M, 4, K)
    assert b.reduce("sum", x, [-1, 0]).ttype.shape == (4,)
    assert b._blocks[-1][-1].axes == (0, 2)
    assert b.reduce("max", x, 1, keepdims=True).ttype.shape == (M, 1, K)
    assert b.reduce("mean", x).ttype.shape == ()
    with pytest.raises(BuildError, match="out of range"):
        b.reduce("sum", x, 3)
    with pytest.raises(BuildError, match="twice"):
        b.reduce("sum", x, [1, -2])
    with pytest.raises(BuildError, match="mean"):
        b.reduce("mean", make(I32, 4))
    with pytest.raises(BuildError):
        b.reduce("sum", make(F32))
    assert b.scan("sum", x, -1).ttype == x.ttype and b._blocks[-1][-1].axis == 2
    with pytest.raises(BuildError, match="elements"):
        b.reshape(make(F32, 4, 6), [5, 5])
    assert b.reshape(make(F32, 4, 6), [2, 12]).ttype.shape == (2, 12)
    assert b.expand_dims(x, [-1]).ttype.shape == (M, 4, K, 1)
    assert b.transpose(make(F32, 2, 3)).ttype.shape == (3, 2)
    with pytest.raises(BuildError, match="permutation"):
        b.transpose(x, [0, 0, 1])


# ---------------------------------------------------------------------------------------------
# name_value


def test_name_value():
    b = Builder()
    with b.func("f", inputs=[("x", tensor(F32, 4))], outputs=[("y", tensor(F32, 4))]) as f:
        x, y = f.args
        with b.parallel([(0, 1)]) as (p,):
            t = b.load(x, [ALL])
            # the last op's unnamed result: renamed in place, a new Value returned
            named = b.name_value(t, "xr")
            assert named is not t and named.name == "xr" and named.type == t.type
            assert b._blocks[-1][-1].results == (named,)
            # already named: returned as it is (the new name is only an alias)
            assert b.name_value(named, "alias_name") is named and named.name == "xr"
            e = b.unary("exp", named)
            # not the last op's result any more: returned as it is
            s = b.binary("add", e, 1.0)
            assert b.name_value(e, "late_name") is e and e.name is None
            # a block argument or function argument is never renamed
            assert b.name_value(p, "i") is p and b.name_value(x, "z") is x
            s2 = b.name_value(s, "s")
            b.store(s2, y, [ALL])
    text = print_ir(verify(f.op))
    assert "%xr = tile.load %x " in text
    assert "tile.exp %xr " in text
    assert "%s = tile.add " in text
    assert "late_name" not in text and "alias_name" not in text


def test_a_refined_op_is_not_the_op_it_refines_to_the_passes_that_rewrite_that_op():
    """ptx.ld declares that it refines tile.load: lower-ptx and stage-rows, which rewrite
    tile.load, ask LoadOp.unrefined and leave a ptx.ld alone; a ptx.ld is still a load."""
    from kfc.ir.ptx_ops import CvtPackOp, Ex2ApproxOp, LdOp, StOp
    from kfc.ir.tile_ops import UNARY_CLASSES, CastOp, LoadOp, StoreOp

    assert LoadOp.unrefined(LoadOp(index=())) and not LoadOp.unrefined(LdOp(index=()))
    assert LdOp.unrefined(LdOp(index=())) and isinstance(LdOp(index=()), LoadOp)
    assert StoreOp.unrefined(StoreOp(index=())) and not StoreOp.unrefined(StOp(index=()))
    assert CastOp.unrefined(CastOp()) and not CastOp.unrefined(CvtPackOp())
    assert not StoreOp.unrefined(LoadOp(index=()))
    assert (LdOp.REFINES, StOp.REFINES, CvtPackOp.REFINES) == (LoadOp, StoreOp, CastOp)
    # an op that only shares a base class refines nothing
    assert Ex2ApproxOp.REFINES is None and not UNARY_CLASSES["exp"].unrefined(Ex2ApproxOp())
