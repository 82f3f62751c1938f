"""The layout core (kfc.ir.layouts): one arithmetic for where a row's elements live, shared by
the interpreter (numpy), codegen (C expressions) and the verifier; checked against each other
on random layouts and row lengths."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kfc.ir import layouts
from kfc.ir.types import Layout

pow2 = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128])


def c_value(expr: str, **env) -> int:
    """A C integer expression of non-negative ints, in Python (C's / and % are Python's // and
    % there, its || and && Python's or and and)."""
    text = expr.replace("/", "//").replace("||", " or ").replace("&&", " and ")
    return int(eval(text, {}, env))  # noqa: S307 - test-only, our own text


@settings(max_examples=200, deadline=None, derandomize=True)
@given(t=pow2, v=st.sampled_from([1, 2, 4, 8]), c=st.sampled_from([1, 2, 4]), n=st.integers(1, 3000))
def test_numpy_and_c_agree_on_where_each_element_lives(t, v, c, n):
    row = layouts.Blocked1D(t, v, c)
    assert row.as_layout() == Layout("row", (("threads", t), ("vec", v), ("cluster", c)))
    placed = row.per_lane(np.arange(n, dtype=np.float32), -1.0)
    e = row.chunks(n)
    assert placed.shape == (t * c, e * v)
    seen = placed[placed >= 0].astype(int)
    assert sorted(seen.tolist()) == list(range(n)), "every element lives in exactly one register"
    for lane in {0, t * c - 1, (t * c) // 2}:
        for reg in {0, e * v - 1, v}:
            if reg >= e * v:
                continue
            j = row.element(reg // v, lane, reg % v)
            assert placed[lane, reg] == (j if j < n else -1)
            assert c_value(row.register_in_row_c("i", "g", n), i=reg, g=lane) == (j < n)
            # an expression for the register, as a scan passes it: parenthesised by the caller
            e_, k_ = divmod(reg, v)
            assert c_value(row.register_in_row_c(f"(e * {v} + k)", "g", n), e=e_, k=k_, g=lane) == (j < n)
            start = c_value(row.chunk_start_c("e", "g"), e=reg // v, g=lane)
            assert start == row.element(reg // v, lane)
            assert c_value(row.in_row_c("e", "g", n), e=reg // v, g=lane) == (start < n)
            assert c_value(row.register_element_c("i", "g"), i=reg, g=lane) == j
            # a staged row: CTA `rank` copies span e (threads·vec elements from cta_span_start)
            # to e·span in its buffer; thread t reads its chunk at cta_offset: the same element
            rank, thread, k = lane // t, lane % t, reg % v
            span_start = c_value(row.cta_span_start_c("e", "r"), e=reg // v, r=rank)
            at = c_value(row.cta_offset_c("e", "t"), e=reg // v, t=thread) + k
            assert span_start + (at - (reg // v) * row.span) == j
            assert 0 <= at - (reg // v) * row.span < row.span
    assert row.exact(n) == bool((placed >= 0).all())


def test_lanes_per_cta():
    lanes = layouts.Lanes(64, 2)
    x = np.arange(128)
    assert lanes.per_cta(x)[1, 0] == 64 and lanes.as_layout().kind == "lanes"


def test_of_reads_layouts_and_refuses_the_unknown():
    assert layouts.of(None) is None
    assert layouts.of(Layout("row", (("threads", 32), ("vec", 8), ("cluster", 1)))) == layouts.Blocked1D(32, 8, 1)
    with pytest.raises(ValueError, match="no layout kind #swizzled"):
        layouts.of(Layout("swizzled", ()))
    with pytest.raises(ValueError, match="#row takes threads, vec, cluster"):
        layouts.of(Layout("row", (("threads", 32),)))


def test_disagreement_names_the_parameter():
    row = layouts.Blocked1D(256, 8, 1).as_layout()
    assert layouts.disagreement(row, 256, 8, 1) is None
    assert layouts.disagreement(row, 128, 8, 1) == "threads = 256, but the gpu.launch it is in has threads = 128"
    assert "vec = 8" in layouts.disagreement(row, 256, 4, 1)
    assert layouts.disagreement(layouts.Lanes(256, 1).as_layout(), 256, 4, 1) is None  # lanes have no vec
