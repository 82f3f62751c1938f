"""split-tiles on the CPU: a parallel loop over [A, B] tiles becomes a loop over (index, a)
with [B] tiles, verified against the interpreter (--verify-each), so an op written over a
token's [heads, dim] tile compiles as rows; vectors along either axis take their role from how
they are used, not from their sizes; a reduction over the tiles' first axis becomes a loop over
the rows inside the iteration; a loop it cannot split keeps its tiles and says why."""

import pytest

from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend import parse_kfc
from kfc.ir import print_ir
from kfc.ir.specialize import specialize
from kfc.ir.tile_ops import LoadOp, ParallelOp
from kfc.passes import TILE_PIPELINE, PassContext
from kfc.passes.split_tiles import SplitTiles
from kfc.model.target import parse_target
from tests.example_ops import OPS


def spec_of(tmp_path, text, dtypes=None):
    return parse_kfc(text, str(tmp_path / "op.kfc"), dtypes)


def split(tmp_path, text, dims, dtypes=None):
    spec = spec_of(tmp_path, text, dtypes)
    ctx = PassContext(parse_target("sm_90a"))
    return SplitTiles().run(specialize(spec.func, dims, partial=True), ctx), ctx


@pytest.mark.parametrize("h, d", [(3, 128), (64, 64), (1, 7), (5, 4095)])
def test_a_loop_over_heads_and_dim_becomes_rows(tmp_path, h, d):
    f, _ = split(tmp_path, OPS["headscale"], {"H": h, "D": d}, {"T": "bf16"})
    (loop,) = [op for op in f.body.ops if isinstance(op, ParallelOp)]
    assert loop.rank == 2
    text = print_ir(f)
    assert f"[{h}, {d}]" not in text.split("{", 1)[1].split("\n", 1)[1].replace(f"bf16[S, {h}, {d}]", "")
    loads = {op.operands[0].name: op.result.ttype.shape for op in f.walk() if isinstance(op, LoadOp)}
    assert loads == {"x": (d,), "w": (d,), "g": ()}, "x by rows, the weight along D, the gate one per head"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("h, d", [(3, 128), (64, 64), (1, 7), (5, 4095)])
def test_an_op_over_rank_2_tiles_compiles_under_verify_each(tmp_path, target, h, d):
    spec = spec_of(tmp_path, OPS["headscale"], {"T": "bf16"})
    r = compile_op(spec, parse_target(target), shape={"H": h, "D": d}, verify_each=True)
    assert r.kernel.report.spills == 0


def test_a_loop_it_cannot_split_keeps_its_tiles_and_says_why(tmp_path):
    """Centring each token's heads needs their mean before any head's output: a second pass
    over the heads, which split-tiles does not make."""
    text = """
op center(x: f32[S, H, D]) -> (y: f32[S, H, D]) {
  parallel t in 0..S {
    xt = x[t, :, :]
    mu = mean(xt, axis=0)
    y[t, :, :] = xt - mu
  }
}
"""
    f, ctx = split(tmp_path, text, {"H": 3, "D": 128})
    assert print_ir(f) == print_ir(specialize(spec_of(tmp_path, text).func, {"H": 3, "D": 128}, partial=True))
    why = "a row's work uses the reduction over the tiles' first axis"
    assert any(why in m for _, m in ctx.notes)
    report = ctx.stats["split-tiles"]  # what compile reads to say why, not the note's words
    assert report.split == 0 and len(report.kept) == 1 and why in report.kept[0]
    # what the row passes keep, the tile emitter takes: one CTA a token, its [H, D] tile shared
    r = compile_op(spec_of(tmp_path, text), parse_target("sm_90a"), shape={"H": 3, "D": 128})
    assert r.report["kernels"][0]["grid"][0] == "S" and r.report["pipeline"] == TILE_PIPELINE


@pytest.mark.parametrize("rows", [1, 4])
def test_tiles_whose_first_axis_is_a_slice_keep_their_shape_and_compile(tmp_path, rows):
    """`x[b:b+n, :]` (n = 1 or 4): the slice masks rows past the tensor's end, which a row index
    would not, so the loop keeps its rank-2 tiles (it was split with `:`'s dim taken for the
    slice's, an internal error) and the tile emitter builds it; `kfc check`'s interpreter on the
    final IR against the formula, at an extent the slices do not divide."""
    text = f"""
op rowmax(x: f32[B, N]) -> (m: f32[B, 1]) {{
  parallel b in 0..(B + {rows} - 1) // {rows} {{
    m[b * {rows}:b * {rows} + {rows}, :] = max(x[b * {rows}:b * {rows} + {rows}, :], axis=1)[:, None]
  }}
}}
"""
    f, ctx = split(tmp_path, text, {"N": 8})
    assert ctx.stats["split-tiles"].split == 0
    assert "the tiles' first axis is a slice" in ctx.stats["split-tiles"].kept[0]
    r = compile_op(spec_of(tmp_path, text), parse_target("sm_90a"), shape={"B": 7, "N": 8}, verify_each=True)
    assert r.report["pipeline"] == TILE_PIPELINE and not r.kernel.report.spills


@pytest.mark.parametrize("outer", ["sum", "max", "mean"])
def test_a_reduction_of_a_kept_one_element_axis_is_the_rows_element(tmp_path, outer):
    """`sum(max(xt, axis=1, keepdims=true), axis=1)`: split into rows, the [R, 1] tile is a
    row's scalar, and reducing its one-element axis is that scalar (it was a reduction over
    axis 0 of a scalar, an internal error); compiled under --verify-each, at C = 1 too."""
    text = f"""
op rowpeak(x: f32[B, R, C]) -> (s: f32[B, R]) {{
  parallel b in 0..B {{
    peak = max(x[b, :, :], axis=1, keepdims=true)
    s[b, :] = {outer}(peak * 2.0, axis=1)
  }}
}}
"""
    f, ctx = split(tmp_path, text, {"R": 7, "C": 13})
    assert ctx.stats["split-tiles"].split == 1
    for c in (13, 1):
        r = compile_op(spec_of(tmp_path, text), parse_target("sm_90a"), shape={"R": 7, "C": c}, verify_each=True)
        assert not r.kernel.report.spills


def test_a_reduction_over_the_first_axis_becomes_a_loop_over_the_rows(tmp_path):
    """sum, mean and max over a token's heads: one sequential loop over the heads inside the
    loop over tokens, a [D] accumulator carried for each (bf16 rows summed in f32), the
    token's output after it; the heads' own output is written inside the loop."""
    from kfc.ir.tile_ops import ForOp, StoreOp

    f, ctx = split(tmp_path, OPS["head_sums"], {"H": 17, "D": 1000}, {"T": "bf16"})
    (loop,) = [op for op in f.body.ops if isinstance(op, ParallelOp)]
    assert loop.rank == 1 and ctx.stats["split-tiles"].split == 1
    (heads,) = [op for op in loop.body.ops if isinstance(op, ForOp)]
    assert [str(v.type) for v in heads.results] == ["f32[1000]"] * 3
    assert all(v.ttype.rank <= 1 for op in f.walk() for v in op.results if hasattr(v.type, "space"))
    stores = [op for op in f.walk() if isinstance(op, StoreOp)]
    assert {op.operands[1].name for op in heads.body.ops if isinstance(op, StoreOp)} == {"z"}
    assert {op.operands[1].name for op in stores} == {"y", "z"}


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_a_reduction_over_the_first_axis_compiles_under_verify_each(tmp_path, target, dtype):
    spec = spec_of(tmp_path, OPS["head_sums"], {"T": dtype})
    for h, d in ((17, 1000), (1, 7), (64, 128)):
        r = compile_op(spec, parse_target(target), shape={"H": h, "D": d}, verify_each=True)
        assert r.kernel.report.spills == 0
        assert "for (long long kfc_k" in r.kernel.cu, "the heads are a loop in the kernel"


def test_a_wrong_accumulator_start_is_caught_by_verify_each(tmp_path, monkeypatch):
    from kfc.ir.tile_ops import ReduceKind
    from kfc.passes import split_tiles

    monkeypatch.setitem(split_tiles.AXIS0_KINDS, ReduceKind.SUM, ("add", 1.0))
    spec = spec_of(tmp_path, OPS["head_sums"], {"T": "f32"})
    with pytest.raises(KfcError, match="pass split-tiles changed the results"):
        compile_op(spec, parse_target("sm_90a"), shape={"H": 17, "D": 1000}, verify_each=True)
