"""kfc's own 16-bit float types (kfc.codegen.float16) stand in for cuda_bf16.h and cuda_fp16.h:
a kernel's source includes no CUDA header, and compiles to the PTX the headers' types give."""

import re
import subprocess

import pytest

from kfc.codegen import float16
from kfc.codegen.toolchain import find_toolchain
from kfc.compile import compile_op
from kfc.frontend import load_kfc
from kfc.ir.dtypes import DType
from kfc.model.target import parse_target

# kfc's names and the CUDA headers' for the same thing
CUDA_NAMES = {
    DType.BF16: {"kfc_bf16x2": "__nv_bfloat162", "kfc_bf16_to_f32": "__bfloat162float",
                 "kfc_f32_to_bf16": "__float2bfloat16_rn", "kfc_bf16_of_bits": "__ushort_as_bfloat16",
                 "kfc_bf16_bits": "__bfloat16_as_ushort", "kfc_bf16": "__nv_bfloat16"},
    DType.F16: {"kfc_f16x2": "__half2", "kfc_f16_to_f32": "__half2float", "kfc_f32_to_f16": "__float2half_rn",
                "kfc_f16_of_bits": "__ushort_as_half", "kfc_f16_bits": "__half_as_ushort", "kfc_f16": "__half"},
}
HEADER = {DType.BF16: "cuda_bf16.h", DType.F16: "cuda_fp16.h"}


def with_cuda_headers(cu: str, d: DType) -> str:
    """The same kernel written with the CUDA header's type and conversions instead of kfc's."""
    cu = cu.replace(float16.types_used(float16.TYPE[d]), f"#include <{HEADER[d]}>\n")
    for name in float16.FUNCTIONS:
        cu = cu.replace(float16.FUNCTIONS[name], "")
    for ours, theirs in CUDA_NAMES[d].items():
        cu = re.sub(rf"\b{ours}\b", theirs, cu)
    return cu


def ptx_of(cu: str, tmp_path, name: str) -> str:
    src, out = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
    src.write_text(cu)
    subprocess.run([find_toolchain().nvcc, "-ptx", "-O3", "-std=c++17", "-arch=compute_90a", "-o", str(out), str(src)],
                   check=True, capture_output=True, text=True)
    return "\n".join(line for line in out.read_text().splitlines() if not line.startswith("//"))


@pytest.mark.parametrize("dtype", [DType.BF16, DType.F16])
def test_a_kernel_over_16_bit_floats_compiles_to_the_ptx_the_cuda_headers_give(dtype, tmp_path):
    # fp8 codes of 16-bit rows: both directions of the conversion, bits and the f16 helpers fp8 uses
    result = compile_op(load_kfc("examples/fp8_quant.kfc", {"T": dtype.value}), parse_target("sm_90a"),
                        shape={"N": 512})
    cu = result.kernel.cu
    assert "#include" not in cu and f"struct __align__(2) {float16.TYPE[dtype]}" in cu
    theirs = with_cuda_headers(cu, dtype)
    assert "kfc_bf16" not in theirs.replace("kfc_cvt_pack_bf16", "") and f"#include <{HEADER[dtype]}>" in theirs
    assert ptx_of(cu, tmp_path, "ours") == ptx_of(theirs, tmp_path, "theirs")


def test_a_kernel_defines_only_the_16_bit_types_it_names():
    f32 = compile_op(load_kfc("examples/linear_attention.kfc"), parse_target("sm_90a"))
    assert "#include" not in f32.kernel.cu and "kfc_bf16" not in f32.kernel.cu and "kfc_f16" not in f32.kernel.cu
    f16 = compile_op(load_kfc("kernels/rmsnorm.kfc", {"T": "f16"}), parse_target("sm_90a"), shape={"N": 512})
    assert "struct __align__(2) kfc_f16" in f16.kernel.cu and "kfc_bf16" not in f16.kernel.cu
    assert float16.types_used("kfc_bf16x2 w;").count("struct") == 2  # a pair needs its element
    assert float16.types_used("kfc_cvt_pack_bf16(a, b); float x;") == ""
