"""kfc.ir.bounds: a tile kernel leaves out the bounds tests its IR makes true, and only those.
What the GPU computes with them left out is checked on the GPU machine (tests/gpu/test_kda_gpu.py,
tests/gpu/test_final_ir_gpu.py)."""

import re
from types import SimpleNamespace

from hypothesis import given, settings, strategies as st

from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.bounds import IndexFacts
from kfc.ir.core import Value
from kfc.ir.dtypes import DType
from kfc.ir.tile_ops import BINARY_CLASSES, ConstOp, DimOp
from kfc.ir.types import TensorType
from kfc.model.target import parse_target

# b and h from one linear CTA index m over 0..B*H: h = m rem H lies in [0, H), b = m div H is
# nonnegative but not known below B; r comes from memory, so nothing is known of it
GATHERED = """
op gathered(x: f32[R, 16, 32], idx: i64[B], s: f32[H]) -> (y: f32[B, H, 16, 32]) {
  parallel b in 0..B, h in 0..H {
    r = idx[b]
    y[b, h, :, :] = cumsum(x[r, :, :], axis=0) * s[h]
  }
}
check {
  inputs = {idx: randint(0, 5)}
  shapes = [{R: 5, B: 3, H: 2}]
}
"""


def test_an_index_the_loop_bounds_is_not_tested_and_one_from_memory_is():
    r = compile_op(parse_kfc(GATHERED), parse_target("sm_90a"), shape={"R": 5})
    cu = r.kernel.cu
    assert "p_s[(long long)(v" in cu and "< dim_H" not in cu  # s[h], y[b, h]: h in [0, H) by construction
    assert "< dim_B" in cu and not re.search(r"\(long long\)\(v\d+\) >= 0 && \(long long\)\(v\d+\) < dim_B", cu)
    assert re.search(r"\(long long\)\(v\d+\) >= 0 && \(long long\)\(v\d+\) < 5LL", cu)  # x[r]: both kept


def test_kdas_kernels_test_their_rows_but_not_their_head():
    shape = {"T": 4096, "K": 128, "V": 128}
    prepare = compile_op(load_kfc("kernels/kda_prepare_flashkda.kfc", {"C": "16"}), parse_target("sm_90a"),
                         shape=shape).kernel.cu
    recurrence = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16", "SD": "f32", "WD": "f32"}),
                            parse_target("sm_90a"), shape=shape).kernel.cu
    for cu in (prepare, recurrence):
        assert "< dim_H" not in cu  # the head: m rem H of the linear CTA index m over 0..(...) * H
        assert re.search(r"\) < \(long long\)\((v|kfc_c)\d+\)", cu)  # a row against its sequence's end: kept
    assert "< dim_T" in prepare and "< 4096LL" in recurrence  # and against the tensor's rows


# --- soundness: what IndexFacts claims holds at every point of random loops ------------------
INDEX = TensorType(DType.INDEX)
DIMS = ("D0", "D1")


class Program:
    """Index expressions over one parallel index m in 0..hi, built op by op, with what each
    computes at given dims and m (floor division and remainder, as the kernels do)."""

    def __init__(self):
        self.owner, self.eval = {}, {}
        self.m = Value(INDEX)
        self.eval[self.m] = lambda dims, m: m

    def add(self, op, fn):
        self.owner[op.result] = op
        self.eval[op.result] = fn
        return op.result

    def const(self, c):
        return self.add(ConstOp(value=c, results=(Value(INDEX),)), lambda dims, m: c)

    def dim(self, sym):
        return self.add(DimOp(sym=sym, results=(Value(INDEX),)), lambda dims, m: dims[sym])

    def binary(self, name, a, b):
        fa, fb = self.eval[a], self.eval[b]
        fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
              "div": lambda x, y: x // y, "rem": lambda x, y: x % y}[name]
        return self.add(BINARY_CLASSES[name](operands=(a, b), results=(Value(INDEX),)),
                        lambda dims, m: fn(fa(dims, m), fb(dims, m)))


@st.composite
def programs(draw):
    p = Program()
    leaves = [p.m, *(p.dim(s) for s in DIMS), *(p.const(c) for c in (-2, 0, 1, 3))]
    # the loop's extent: a product of dims and a constant, or a sum (no factor known)
    hi = leaves[draw(st.integers(1, 2))]
    for _ in range(draw(st.integers(0, 2))):
        hi = p.binary(draw(st.sampled_from(["mul", "mul", "add"])), hi, draw(st.sampled_from(leaves[1:])))
    lo = p.const(draw(st.sampled_from([0, 0, 1, -1])))
    values = list(leaves)
    for _ in range(draw(st.integers(1, 6))):
        values.append(p.binary(draw(st.sampled_from(["add", "sub", "mul", "div", "rem"])),
                               draw(st.sampled_from(values)), draw(st.sampled_from(values))))
    return p, lo, hi, values


@settings(max_examples=300, deadline=None)
@given(programs(), st.fixed_dictionaries({s: st.integers(0, 5) for s in DIMS}))
def test_what_index_facts_claim_holds_at_every_iteration(program, dims):
    p, lo, hi, values = program
    loop = SimpleNamespace(body=SimpleNamespace(args=(p.m,)), lowers=(lo,), uppers=(hi,))
    facts = IndexFacts(loop, p.owner.get)
    start, stop = p.eval[lo](dims, 0), p.eval[hi](dims, 0)
    extents = [SimpleNamespace(name=s, offset=0) for s in DIMS] + [1, 3]
    for v in values:
        for m in range(start, min(stop, start + 64)):
            try:
                x = p.eval[v](dims, m)
            except ZeroDivisionError:  # a division by zero is the program's error, on any path
                continue
            if facts.nonnegative(v):
                assert x >= 0
            for e in extents:
                if facts.below(v, e):
                    assert x < (dims[e.name] if not isinstance(e, int) else e)


def test_a_remainder_by_a_dim_is_below_it_only_where_the_dim_divides_the_loop():
    # where D0 may be 0 while the loop runs, m rem D0 is no index into D0's axis, nor known
    # nonnegative: the GPU divides by zero there (the interpreter reports an error) and would read
    # past an empty axis where the tests it replaces kept it out
    p = Program()
    d0, d1 = p.dim("D0"), p.dim("D1")
    for hi, known in ((p.binary("mul", d1, d0), True), (d1, False), (p.binary("add", d1, d0), False)):
        loop = SimpleNamespace(body=SimpleNamespace(args=(p.m,)), lowers=(p.const(0),), uppers=(hi,))
        h = p.binary("rem", p.m, d0)
        facts = IndexFacts(loop, p.owner.get)
        assert facts.below(h, SimpleNamespace(name="D0", offset=0)) is known and facts.nonnegative(h) is known
        assert not facts.below(h, SimpleNamespace(name="D1", offset=0))
