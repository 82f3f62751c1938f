"""The `ptx` dialect: ops that name one PTX instruction family each. Their semantics are those
of the tile op they refine (a `ptx.ld` is a load, `ptx.ex2_approx` is 2^x), so the interpreter
checks the lowering; codegen turns each into the instruction template of kfc.codegen.ptx.

    ptx.ld        ld.global[.cache].v{1,2,4}.b32 — `vec` elements per access, `cache` hint
    ptx.st        st.global[.cache].v{1,2,4}.b32
    ptx.rsqrt_approx   rsqrt.approx.ftz.f32
    ptx.ex2_approx     ex2.approx.ftz.f32
    ptx.rcp_approx     rcp.approx.ftz.f32
    ptx.cvt_pack       cvt.rn.{bf16x2,f16x2}.f32: two fp32 values rounded into one 32-bit register
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from .core import define_op
from .dtypes import DType
from .tile_ops import CastOp, LoadOp, OperandKind, StoreOp, UnaryOp

CACHE_HINTS = ("", "cs", "nc_na", "lu", "evict_last")


def _cache(v: str) -> str:
    if v not in CACHE_HINTS:
        raise ValueError(f"cache hint must be one of {CACHE_HINTS}, not {v!r}")
    return v


@define_op("ptx.ld")
class LdOp(LoadOp):
    REFINES: ClassVar[type] = LoadOp
    vec: int = 1
    cache: str = attrs.field(default="", converter=_cache)

    def verify_(self) -> None:
        super().verify_()
        t = self.operands[0].ttype
        if self.vec * t.dtype.itemsize > 16 or self.vec < 1 or self.vec & (self.vec - 1):
            raise self.error(f"vec {self.vec} of {t.dtype} is not a 1..16-byte power-of-two access")


@define_op("ptx.st")
class StOp(StoreOp):
    REFINES: ClassVar[type] = StoreOp
    vec: int = 1
    cache: str = attrs.field(default="", converter=_cache)

    def verify_(self) -> None:
        super().verify_()
        t = self.operands[1].ttype
        if self.vec * t.dtype.itemsize > 16 or self.vec < 1 or self.vec & (self.vec - 1):
            raise self.error(f"vec {self.vec} of {t.dtype} is not a 1..16-byte power-of-two access")


@attrs.frozen(eq=False, kw_only=True)
class _F32Unary(UnaryOp):
    OPERAND_KIND: ClassVar[OperandKind] = OperandKind.FLOAT

    def verify_(self) -> None:
        super().verify_()
        if self.operands[0].ttype.dtype is not DType.F32:
            raise self.error(f"operates on f32, not {self.operands[0].ttype.dtype}")


@define_op("ptx.rsqrt_approx")
class RsqrtApproxOp(_F32Unary):
    FN: ClassVar[str] = "rsqrt"  # its semantics, for the interpreter


@define_op("ptx.ex2_approx")
class Ex2ApproxOp(_F32Unary):
    FN: ClassVar[str] = "exp2"


@define_op("ptx.rcp_approx")
class RcpApproxOp(_F32Unary):
    """rcp.approx.ftz.f32: 1/x in one MUFU instruction, within 1 ulp (the PTX ISA's bound), where
    an IEEE division takes a dozen and a branch to its slow path."""

    FN: ClassVar[str] = "rcp"


@define_op("ptx.tanh_approx")
class TanhApproxOp(_F32Unary):
    """tanh.approx.f32: one MUFU instruction, absolute error at most about 2^-11 (the PTX ISA's
    bound), where tanhf takes a dozen; for outputs a 16-bit rounding (2^-9 for bf16) dwarfs it."""

    FN: ClassVar[str] = "tanh"


@define_op("ptx.cvt_pack")
class CvtPackOp(CastOp):
    REFINES: ClassVar[type] = CastOp

    def verify_(self) -> None:
        super().verify_()
        src, dst = self.operands[0].ttype.dtype, self.result.ttype.dtype
        if src is not DType.F32 or dst not in (DType.BF16, DType.F16):
            raise self.error(f"packs f32 into bf16 or f16, not {src} into {dst}")
