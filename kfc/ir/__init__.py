"""The typed tile-level IR: types, ops, builder, printer, parser, verifier, interpreter."""

from .builder import ALL, Builder, BuildError, Slice
from .core import OP_REGISTRY, Block, Op, Value
from .dtypes import DType
from .func import FuncOp
from .parser import parse_ir
from .printer import print_ir
from .tile_ops import *  # noqa: F401,F403 - the tile dialect's op classes
from . import gpu_ops, mma_ops, ptx_ops, smem_ops  # noqa: F401,E402 - the gpu and ptx dialects register on import, as tile does
from .types import Layout, MemSpace, SymDim, TensorType, scalar, tensor, tile
from .verifier import verify
