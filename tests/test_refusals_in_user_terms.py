"""Refusals that come late (codegen, accelerate-matmul) still speak the program's language: the
reduction or operand as written, dtypes a program can name (i64, never the IR's `index`), no IR op
names, the place in the source, and what to write instead."""

from __future__ import annotations

import re

import pytest

from kfc.cli import main

IR_NAMES = re.compile(r"\b(tile|gpu|ptx|smem)\.[a-z_]+|\bis index\b|\bindex (tile|values|row)")


def compile_error(tmp_path, capsys, source: str) -> str:
    path = tmp_path / "op.kfc"
    path.write_text(source)
    assert main(["compile", str(path), "--target", "sm_90", "-o", str(tmp_path / "out")]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("row, want", [
    ("where(xr == lo_, iota(N), N)", "min(...) over a row of i64 values"),
    ("i64(xr)", "min(...) over a row of i64 values"),
])
def test_a_row_reduction_of_i64_names_the_reduction_and_says_to_cast(tmp_path, capsys, row, want):
    err = compile_error(tmp_path, capsys, f"""
op argmin_i(x: i32[M, N]) -> (idx: i64[M]) {{
  parallel m in 0..M {{
    xr = x[m, :]
    lo_ = min(xr)
    idx[m] = i64(min({row}))
  }}
}}
check {{
  reference = "x.argmin(-1)"
  shapes = [{{M: 5, N: 100}}]
}}
""")
    assert want in err and ":6:18: error:" in err and "min(i32(...))" in err, err
    assert not IR_NAMES.search(err.replace(str(tmp_path), "")), err


@pytest.mark.parametrize("body, want, hint", [
    ("c = f16(dot(a, b) + f32(bias))", "cannot take f32(bias), a cast of the vector 'bias' [72]",
     "declare 'bias' as f32[72] and add it uncast"),
    ("c = f16(dot(a, b) + rb[:, None])", "cannot take the row vector 'rb' [64] (one value per row of the product",
     "second op"),
    ("c = f16(dot(a, b) + f32(r))", "cannot take the residual 'r' [64, 72] (a tensor the size of the product)",
     "second op"),
])
def test_a_gemm_epilogue_refusal_names_what_was_written(tmp_path, capsys, body, want, hint):
    err = compile_error(tmp_path, capsys, f"""
op g(a: f16[M, K], b: f16[K, N], bias: f16[N], rb: f32[M], r: f16[M, N]) -> (c: f16[M, N]) {{
  {body}
}}
check {{
  reference = "a"
  shapes = [{{M: 64, N: 72, K: 32}}]
}}
""")
    assert want in err and hint in err and "only scalars" not in err.split("hint:")[0], err
    assert ":3:" in err and "columns" in err and not IR_NAMES.search(err.replace(str(tmp_path), "")), err
