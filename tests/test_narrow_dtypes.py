"""fp8 (e4m3, e5m2), i8 and u8 through the language, the interpreter and the code generator, on
the CPU: conversions round and saturate as torch's `.to()` does; loads, stores and casts of every
one compile for sm_90a and sm_100a (vector stores where rows allow, single bytes where they do
not); `round` and `bitcast`; exact outputs get no approximation by default, and `kfc check`
names the pass where an approximation made the final IR depart. The GPU half is
tests/gpu/test_final_ir_gpu.py."""

import json
import re

import numpy as np
import pytest
import torch

from kfc.cli import main
from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend.spec import parse_kfc
from kfc.ir.dtypes import DType, convert
from kfc.ir.interpreter import run
from kfc.model.target import parse_target
from tests.example_ops import EXAMPLES

HOSTILE = [0.0, -0.0, 1e-10, -1e-10, 2.0**-10, 2.0**-9 * 1.5, 0.1, 447.0, 448.0, 455.9, 456.0, 463.9, 464.0, 464.1,
           480.0, 1e6, -1e6, 57343.0, 57344.0, 61439.0, 61440.0, 61441.0, 2.0**-17, 2.0**-16 * 1.5,
           float("inf"), float("-inf"), float("nan"), -float("nan")]


@pytest.mark.parametrize("dtype", [DType.E4M3, DType.E5M2], ids=str)
@pytest.mark.parametrize("src", [np.float32, np.float64], ids=["f32", "f64"])
def test_fp8_conversion_is_torchs_to_the_bit(dtype, src):
    x = np.array(HOSTILE + list(np.random.default_rng(0).normal(0, 300, 4000)), dtype=src)
    want = torch.from_numpy(x).to(dtype.torch).view(torch.uint8).numpy()
    assert (convert(x, dtype).view(np.uint8) == want).all()


def test_floats_become_integers_truncated_clamped_and_nan_as_zero():
    x = np.array([1.5, -1.5, 127.9, 128.0, -129.0, 300.0, float("nan"), float("inf"), float("-inf")], np.float32)
    assert convert(x, DType.I8).tolist() == [1, -1, 127, 127, -128, 127, 0, 127, -128]
    assert convert(x, DType.U8).tolist() == [1, 0, 127, 128, 0, 255, 0, 255, 0]
    assert convert(np.array([3e9, -3e9, float("nan")], np.float32), DType.I32).tolist() == [2**31 - 1, -2**31, 0]


def interpret(text: str, **inputs):
    spec = parse_kfc(text, "t.kfc")
    return run(spec.func, inputs)


def test_a_cast_to_e4m3_saturates_in_the_interpreter():
    out = interpret("op f(x: f32[N]) -> (y: e4m3[N]) { y = e4m3(x) }", x=np.array([1e6, -500.0, 1.0], np.float32))
    assert out["y"].view(np.uint8).tolist() == [0x7E, 0xFE, 0x38]


def test_round_is_half_to_even_and_bitcast_keeps_the_bits():
    out = interpret("op f(x: f32[N]) -> (r: f32[N], b: u8[N]) { r = round(x)\n b = bitcast(e4m3(x), u8) }",
                    x=np.array([0.5, 1.5, 2.5, -0.5, 448.0], np.float32))
    assert out["r"].tolist() == [0.0, 2.0, 2.0, -0.0, 448.0]
    assert out["b"].tolist() == [0x30, 0x3C, 0x42, 0xB0, 0x7E]


def test_a_bitcast_between_widths_is_one_located_error():
    with pytest.raises(KfcError) as e:
        parse_kfc("op f(x: f32[N]) -> (y: u8[N]) {\n  y = bitcast(x, u8)\n}", "t.kfc")
    assert str(e.value.span).startswith("t.kfc:2:") and "keeps the width" in e.value.message


ROWS = """
op narrow(x: bf16[M, N], a: {src}[M, N]) -> (q: {dst}[M, N], back: bf16[M, N], first: {dst}[M]) {{
  parallel m in 0..M {{
    xr = f32(x[m, :])
    q[m, :] = {dst}(xr * 8.0)
    back[m, :] = bf16(f32(a[m, :]) + xr + f32(a[m, 0]))
    first[m] = {dst}(max(xr))
  }}
}}
"""


@pytest.mark.parametrize("src, dst", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("i8", "i8"), ("u8", "u8")])
@pytest.mark.parametrize("n", [4096, 7])
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_loads_stores_and_casts_of_one_byte_dtypes_compile(src, dst, n, target):
    spec = parse_kfc(ROWS.format(src=src, dst=dst), "narrow.kfc")
    r = compile_op(spec, parse_target(target), shape={"N": n})
    ptx = r.kernel.ptx
    assert r.kernel.report.spill_stores == 0
    if dst in ("e4m3", "e5m2"):
        assert f"cvt.rn.satfinite.{dst}x2.f32" in ptx
    if src == "e4m3":
        assert "cvt.rn.f16x2.e4m3x2" in ptx
    if n == 4096:  # 16 one-byte codes a thread, stored as four 32-bit words at once
        assert re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx)
    else:  # rows of 7 bytes: one byte at a time
        assert re.search(r"st\.global(\.\w+)*\.b8", ptx)


def test_a_cast_from_f64_to_fp8_is_refused_with_its_place():
    spec = parse_kfc("op f(x: f32[M, N], s: f64 = 3.0) -> (y: e4m3[M, N]) {\n  parallel m in 0..M {\n"
                     "    y[m, :] = e4m3(x[m, :] * f32(e4m3(s)))\n  }\n}", "t.kfc")
    with pytest.raises(KfcError) as e:
        compile_op(spec, parse_target("sm_90a"), shape={"N": 256})
    assert "round twice" in e.value.message and str(e.value.span).startswith("t.kfc:3:")


def approximations(tmp_path, path, *extra):
    out = tmp_path / "out"
    assert main(["compile", str(path), "-o", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text())["approximations"]


def test_exact_outputs_get_no_approximation_by_default_and_the_report_lists_them(tmp_path):
    assert approximations(tmp_path, EXAMPLES / "fp8_quant.kfc") == []
    assert approximations(tmp_path, EXAMPLES / "int8_quant.kfc") == []
    softmax = approximations(tmp_path, "kernels/softmax.kfc")
    assert {a["what"] for a in softmax} >= {"ex2.approx for exp"}
    assert all(a["pass"] == "lower-ptx" and a["at"].startswith("kernels/softmax.kfc:") for a in softmax)


def test_an_approximation_goes_only_where_no_exact_output_depends_on_it(tmp_path):
    """router's softmax weight takes ex2.approx while its expert index stays exact; where an exact
    output is computed from the exponentials too, they keep expf."""
    router = approximations(tmp_path, EXAMPLES / "router.kfc", "--shape", "N=4096")
    assert [a["what"] for a in router] == ["ex2.approx for exp"]
    # staged rows keep the measured kernel: approximated, it took 162 registers instead of 128
    assert approximations(tmp_path, EXAMPLES / "router.kfc", "--shape", "N=32768") == []
    both = tmp_path / "both.kfc"
    both.write_text("op f(x: f32[M, N]) -> (w: f32[M], k: i32[M]) {\n  parallel m in 0..M {\n"
                    "    s = sum(exp(x[m, :]))\n    w[m] = s\n    k[m] = i32(s)\n  }\n}\n")
    assert approximations(tmp_path, both, "--shape", "N=1024") == []
    guarded = tmp_path / "guarded.kfc"  # a condition decides where the exact output is written
    guarded.write_text("op f(x: f32[M, N]) -> (w: f32[M], k: i32[M]) {\n  parallel m in 0..M {\n"
                       "    s = sum(exp(x[m, :]))\n    w[m] = s\n    if s > 1.0 {\n      k[m] = 1\n    }\n  }\n}\n")
    assert approximations(tmp_path, guarded, "--shape", "N=1024") == []


APPROX_ON = ("canonicalize,cse,dce,stage-rows,tile,lower-reductions,fuse-reductions,lower-ptx{approx=on},"
             "canonicalize,cse,dce")


def test_kfc_check_names_the_pass_where_the_final_ir_departs(tmp_path, capsys):
    path = str(EXAMPLES / "fp8_quant.kfc")
    assert approximations(tmp_path, path, "-p", APPROX_ON) != []
    capsys.readouterr()
    assert main(["check", path, "--dtype", "T=bf16", "--seed", "0", "-p", APPROX_ON]) == 1
    out = capsys.readouterr().out
    assert "first departs: after pass lower-ptx{approx=on}" in out
    assert main(["check", path, "--dtype", "T=bf16", "--seed", "0"]) == 0  # the default pipeline is exact
    assert " final " in capsys.readouterr().out


def test_the_check_block_names_the_authority_for_exact_outputs():
    op = "op f(x: f32[N]) -> (y: e4m3[N]) { y = e4m3(x) }\ncheck {\n  reference = \"x.to(torch.float8_e4m3fn)\"\n"
    assert parse_kfc(op + "}", "t.kfc").check.exact_reference == "cpu"
    assert parse_kfc(op + "  exact_reference = \"device\"\n}", "t.kfc").check.exact_reference == "device"
    with pytest.raises(KfcError) as e:
        parse_kfc(op + "  exact_reference = \"gpu\"\n}", "t.kfc")
    assert str(e.value.span).startswith("t.kfc:4:") and "cpu" in e.value.message


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.I32, DType.E4M3])
def test_converting_to_the_dtype_an_array_has_is_a_copy_of_it(dtype):
    a = convert(np.array([1.5, -2.0, 448.0, 0.25], dtype=np.float32), dtype)
    b = convert(a, dtype)
    assert b is not a and b.dtype == a.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
    b[0] = 0  # the caller owns what it gets
    assert a[0] != 0
