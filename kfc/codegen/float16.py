"""kfc's own 16-bit float types in generated code: bf16 and f16 as their bits, with the
conversions to and from f32 that cuda_bf16.h and cuda_fp16.h make on sm_90 and later (the same
cvt instructions). Why not those headers: parsing them is half of nvcc's time on a small kernel
(nvcc 13.0: 0.63 s for rmsnorm with cuda_bf16.h, 0.31 s without), and a kernel needs only
the types, their pairs and four conversions.

A value converts implicitly from float (rounding to nearest even) and to float, as the CUDA
types do, so `pair.x = acc` and `(kfc_bf16)(x)` mean what they mean with the headers."""

from __future__ import annotations

import re

from ..ir.dtypes import DType
from .ptx import definitions

# the C type of a 16-bit float, and of two of them side by side (one 32-bit word)
TYPE = {DType.BF16: "kfc_bf16", DType.F16: "kfc_f16"}
PAIR = {DType.BF16: "kfc_bf16x2", DType.F16: "kfc_f16x2"}
# f32 <-> the type, and the type <-> its bits as an unsigned short
TO_F32 = {DType.BF16: "kfc_bf16_to_f32", DType.F16: "kfc_f16_to_f32"}
FROM_F32 = {DType.BF16: "kfc_f32_to_bf16", DType.F16: "kfc_f32_to_f16"}
FROM_BITS = {DType.BF16: "kfc_bf16_of_bits", DType.F16: "kfc_f16_of_bits"}
TO_BITS = {DType.BF16: "kfc_bf16_bits", DType.F16: "kfc_f16_bits"}

# the conversions' asm, character for character as the CUDA headers write it: the same text gives
# the same PTX, while `cvt...;` without the braces changed cicc's unrolling of kda_fwd at C = 32
# (7289 PTX lines against 7758)
_ROUND = {DType.BF16: r"{  cvt.rn.bf16.f32 %0, %1;}\n", DType.F16: r"{  cvt.rn.f16.f32 %0, %1;}\n"}
_WIDEN = {DType.BF16: r"{ cvt.f32.bf16 %0, %1;}\n", DType.F16: r"{  cvt.f32.f16 %0, %1;}\n"}


def _type_definition(d: DType) -> str:
    t = TYPE[d]
    return (f"struct __align__(2) {t} {{\n"
            f"  unsigned short bits;\n"
            f"  {t}() = default;\n"
            f"  __device__ {t}(float f) {{ asm(\"{_ROUND[d]}\" : \"=h\"(bits) : \"f\"(f)); }}\n"
            f"  __device__ operator float() const {{ float f; asm(\"{_WIDEN[d]}\" : \"=f\"(f) : \"h\"(bits)); "
            f"return f; }}\n"
            f"}};\n"
            f"struct __align__(4) {PAIR[d]} {{ {t} x, y; }};\n")


def _functions(d: DType) -> str:
    t = TYPE[d]
    return (f"static __device__ __forceinline__ float {TO_F32[d]}({t} h) {{ return (float)h; }}\n"
            f"static __device__ __forceinline__ {t} {FROM_F32[d]}(float f) {{ return {t}(f); }}\n"
            f"static __device__ __forceinline__ {t} {FROM_BITS[d]}(unsigned short b) {{ {t} h; h.bits = b; return h; }}\n"
            f"static __device__ __forceinline__ unsigned short {TO_BITS[d]}({t} h) {{ return h.bits; }}\n")


# the conversions, as kfc.codegen.ptx's device functions: a kernel's source holds those it calls
FUNCTIONS = definitions("".join(_functions(d) for d in TYPE))
_TYPES = {d: _type_definition(d) for d in TYPE}
_NAMED = {d: re.compile(rf"\b{TYPE[d]}(x2)?\b") for d in TYPE}


def types_used(text: str) -> str:
    """The definitions of the 16-bit float types `text` names (its device functions included)."""
    return "".join(_TYPES[d] for d in TYPE if _NAMED[d].search(text))
