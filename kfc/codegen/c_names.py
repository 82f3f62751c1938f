"""The C names and types of generated code, shared by the kernels a row program compiles to
(kfc.codegen.cuda, kfc.codegen.row_sums): the C type of each dtype, how a float travels in and
out of f32, the names of the op's parameters and dims, and a kernel parameter as the launch
contract lists it."""

from __future__ import annotations

import math

import attrs
import numpy as np

from ..ir.dtypes import DType, convert
from ..ir.tile_ops import ScratchOp
from ..ir.types import MemSpace
from . import float16

C_TYPES = {
    DType.F32: "float", DType.F64: "double", DType.BF16: float16.TYPE[DType.BF16], DType.F16: float16.TYPE[DType.F16],
    DType.E4M3: "unsigned char", DType.E5M2: "unsigned char",  # fp8 travels as its bits
    DType.I8: "signed char", DType.U8: "unsigned char", DType.I32: "int", DType.I64: "long long", DType.INDEX: "long long",
    DType.BOOL: "bool",
}
# 16-bit floats travel through registers as raw bits
BITS_TO = float16.FROM_BITS
TO_BITS = float16.TO_BITS


# Every name in the emitted C++ lives in one of these namespaces, so none can collide with another,
# with a C++ keyword, a CUDA built-in (threadIdx, float, new) or a macro: the user's parameters and
# dims carry a prefix no generated name starts with; kfc's own names are `kfc_*`, short loop
# counters (e, i, w, c) and numbered temporaries (v1, w2, s3), none of which starts with a prefix.
PARAM_PREFIX = "p_"
DIM_PREFIX = "dim_"
KERNEL_PREFIX = "kfc_kernel_"


def c_param(name: str) -> str:
    """The C name of the op's parameter `name` (an input, scalar or output)."""
    return PARAM_PREFIX + name


def c_dim(sym: str) -> str:
    """The C name of the kernel argument that carries the size of dim `sym`."""
    return DIM_PREFIX + sym


def c_extent(d) -> str:
    """A tensor dim's size in C: a literal, or its dim argument plus its offset."""
    if isinstance(d, int):
        return f"{d}LL"
    return f"({c_dim(d.name)} + {d.offset}LL)" if d.offset else c_dim(d.name)


def c_kernel(op_name: str) -> str:
    return KERNEL_PREFIX + op_name


def c_tensor_map(name: str) -> str:
    """The C name of the TMA descriptor parameter of the op's tensor `name`: kfc's own, beside
    the tensor's pointer c_param(name)."""
    return "kfc_tm_" + c_param(name)


@attrs.frozen
class KernelParam:
    name: str        # the parameter's name in the op (a dim's symbol for kind "dim")
    kind: str        # "tensor" | "scalar" | "dim" | "workspace" (global memory the runtime allocates)
                     # | "tensor_map" (a TMA descriptor of the op's tensor `name`, encoded by the runtime)
    ctype: str
    dtype: str
    optional: bool = False
    is_output: bool = False
    shape: tuple[str, ...] = ()  # a workspace's, as ir/constexpr expressions of the dims
    box: tuple[int, ...] = ()    # a tensor map's [box_rows, box_cols], outer first
    swizzle: int = 0             # a tensor map's swizzle in bytes: 0, 32, 64 or 128

    @property
    def cname(self) -> str:
        if self.kind == "workspace":
            return self.name  # kfc's own name (kfc_ws<k>): no parameter of the op can take it
        if self.kind == "tensor_map":
            return c_tensor_map(self.name)
        return c_dim(self.name) if self.kind == "dim" else c_param(self.name)

    def decl(self) -> str:
        """The parameter in the kernel's signature."""
        if self.kind in ("tensor", "workspace"):
            const = "" if self.is_output else "const "
            return f"{const}{self.ctype}* __restrict__ {self.cname}"
        if self.kind == "tensor_map":
            return f"const __grid_constant__ {self.ctype} {self.cname}"
        return f"{self.ctype} {self.cname}"

    def contract(self) -> dict:
        # each kind lists only its own fields: the other kinds' entries stay as they were
        only = {"shape": "workspace", "box": "tensor_map", "swizzle": "tensor_map"}
        return attrs.asdict(self, filter=lambda a, v: only.get(a.name, self.kind) == self.kind,
                            value_serializer=lambda _, a, v: list(v) if a is not None and a.name in ("shape", "box")
                            else v)


# fp8 to and from f32 (kfc.codegen.ptx's prelude): torch's rounding, saturation and NaNs
FP8_TO_F32 = {DType.E4M3: "kfc_e4m3_to_f32", DType.E5M2: "kfc_e5m2_to_f32"}
F32_TO_FP8 = {DType.E4M3: "kfc_f32_to_e4m3", DType.E5M2: "kfc_f32_to_e5m2"}


def as_float(expr: str, dtype: DType) -> str:
    """A 16-bit or 8-bit float as f32 (other dtypes as they are)."""
    if dtype in float16.TO_F32:
        return f"{float16.TO_F32[dtype]}({expr})"
    if dtype in FP8_TO_F32:
        return f"{FP8_TO_F32[dtype]}({expr})"
    return expr


def from_float(expr: str, dtype: DType) -> str:
    """An f32 rounded to a 16-bit or 8-bit float (other dtypes as they are)."""
    if dtype in float16.FROM_F32:
        return f"{float16.FROM_F32[dtype]}({expr})"
    if dtype in F32_TO_FP8:
        return f"{F32_TO_FP8[dtype]}({expr})"
    return expr


def to_int(expr: str, dtype: DType) -> str:
    """An f32 as an integer the way the GPU's cvt.rzi converts (and kfc.ir.dtypes.convert
    computes): truncated, clamped to the type's range, NaN to 0. C++'s cast of a float to a
    narrow integer is undefined out of range, so 8-bit ones clamp the 32-bit conversion."""
    if dtype is DType.I8:
        return f"(signed char)max(-128, min(127, (int)({expr})))"
    if dtype is DType.U8:
        return f"(unsigned char)max(0, min(255, (int)({expr})))"
    return f"({C_TYPES[dtype]})({expr})"


def _f32_literal(v: float) -> str:
    """A C float literal that rounds to the same f32 as numpy does (repr is exact for doubles)."""
    if math.isnan(v):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(v):
        return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return f"{float(v)!r}f"


def literal(value, dtype: DType) -> str:
    if dtype.is_float:
        text = _f32_literal(float(value))
        if dtype is DType.F32:
            return text
        if dtype is DType.F64:
            return text[:-1] if text.endswith("f") else f"(double){text}"
        if dtype in F32_TO_FP8:  # its bits, rounded as a cast would round
            return f"(unsigned char){int(convert(float(value), dtype).view(np.uint8))}u"
        return f"({C_TYPES[dtype]})({text})"
    if dtype.is_bool:
        return "true" if value else "false"
    return f"({C_TYPES[dtype]})({int(value)}LL)"


def argument_params(func) -> list[KernelParam]:
    """The op's arguments as kernel parameters, in signature order: a scalar by value, a tensor
    by pointer."""
    outputs = set(func.outputs)
    out = []
    for v in func.args:
        t = v.ttype
        if t.space is MemSpace.REG:
            out.append(KernelParam(v.name, "scalar", C_TYPES[t.dtype], str(t.dtype)))
        else:
            out.append(KernelParam(v.name, "tensor", C_TYPES[t.dtype], str(t.dtype), t.optional, v in outputs))
    for op in func.body.ops:  # scratch tensors: the runtime allocates each per call
        if isinstance(op, ScratchOp):
            t = op.result.ttype
            out.append(KernelParam(scratch_name(op.result), "workspace", C_TYPES[t.dtype], str(t.dtype), is_output=True,
                                   shape=tuple(str(d) for d in t.shape)))
    return out


def scratch_name(v) -> str:
    """A scratch tensor's C name and workspace name: kfc's own, so no parameter can take it."""
    return f"kfc_ws_{v.name}"


def dim_params(func) -> list[KernelParam]:
    """The op's dims as kernel parameters, after everything else."""
    return [KernelParam(s, "dim", "long long", "index") for s in func.symbols]
