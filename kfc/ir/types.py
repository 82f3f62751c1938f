"""IR types: tensors and tiles with shape (literal or symbolic dims), memory space and layout.

Textual form (also what `str()` gives):

    f32                      a scalar in registers
    f32[64, K]               a register tile; K is a symbol bound when the kernel is specialised
    bf16[M, N] @global       a tensor in global memory
    i32[N + 1] @global       dims may be a symbol plus a constant
    f32[N, H, K, V] @global? an optional tensor (a caller may pass none)
    f32[128, 64] @shared #swizzle<bytes = 128>   a layout, as Triton keeps it in the type
"""

from __future__ import annotations

import enum
from typing import Union

import attrs

from .attributes import format_attr
from .dtypes import DType


@attrs.frozen(repr=False)
class SymDim:
    """A symbolic dimension `name + offset`, bound to an int when a kernel is specialised."""

    name: str
    offset: int = 0

    def __str__(self) -> str:
        if self.offset > 0:
            return f"{self.name} + {self.offset}"
        if self.offset < 0:
            return f"{self.name} - {-self.offset}"
        return self.name

    # as written in .kfc, also inside a formatted list or tuple of dims: messages show [N, K]
    __repr__ = __str__

    def bind(self, env: dict[str, int]) -> "Dim":
        if self.name in env:
            return env[self.name] + self.offset
        return self


Dim = Union[int, SymDim]


def dim_str(d: Dim) -> str:
    return str(d)


def bind_dim(d: Dim, env: dict[str, int]) -> Dim:
    return d.bind(env) if isinstance(d, SymDim) else d


class MemSpace(enum.Enum):
    REG = "reg"
    GLOBAL = "global"
    SHARED = "shared"
    TMEM = "tmem"

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class Layout:
    """How a tile's elements map onto the machine; passes fill it in, codegen reads it."""

    kind: str
    params: tuple[tuple[str, object], ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return f"#{self.kind}"
        inner = ", ".join(f"{k} = {format_attr(v)}" for k, v in self.params)
        return f"#{self.kind}<{inner}>"

    def get(self, key: str, default=None):
        return dict(self.params).get(key, default)


class Type:
    """Base of all IR types."""


@attrs.frozen
class TensorType(Type):
    dtype: DType
    shape: tuple[Dim, ...] = attrs.field(default=(), converter=tuple)
    space: MemSpace = MemSpace.REG
    layout: Layout | None = None
    optional: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_scalar(self) -> bool:
        return not self.shape

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def symbols(self) -> set[str]:
        return {d.name for d in self.shape if isinstance(d, SymDim)}

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            if not isinstance(d, int):
                raise ValueError(f"{self} has a symbolic shape")
            n *= d
        return n

    def with_shape(self, shape) -> "TensorType":
        return attrs.evolve(self, shape=tuple(shape))

    def with_dtype(self, dtype: DType) -> "TensorType":
        return attrs.evolve(self, dtype=dtype)

    def without_layout(self) -> "TensorType":
        """The type with its layout slot empty: what type inference speaks of."""
        return attrs.evolve(self, layout=None) if self.layout is not None else self

    def bind(self, env: dict[str, int]) -> "TensorType":
        return attrs.evolve(self, shape=tuple(bind_dim(d, env) for d in self.shape))

    def __str__(self) -> str:
        s = str(self.dtype)
        if self.shape or self.space is not MemSpace.REG:
            s += "[" + ", ".join(dim_str(d) for d in self.shape) + "]"
        if self.space is not MemSpace.REG:
            s += f" @{self.space}"
        if self.layout is not None:
            s += f" {self.layout}"
        if self.optional:
            s += "?"
        return s


def bare_type(t):
    """A type with its layout slot ignored: passes fill layouts, type inference does not."""
    return t.without_layout() if isinstance(t, TensorType) else t


def scalar(dtype: DType) -> TensorType:
    return TensorType(dtype, ())


def tile(dtype: DType, *shape: Dim) -> TensorType:
    return TensorType(dtype, tuple(shape))


def tensor(dtype: DType, *shape: Dim, optional: bool = False) -> TensorType:
    return TensorType(dtype, tuple(shape), MemSpace.GLOBAL, optional=optional)
