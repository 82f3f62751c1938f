"""TMA tensor maps: the CUtensorMap a kernel's "tensor_map" parameter takes (see contract.py),
encoded per call from the tensor it describes.

`tiled_layout` is the pure part (what cuTensorMapEncodeTiled is given, and the checks that a
tensor can be described at all), testable without a GPU; `encoding` encodes through
cuda-python and keeps the encodings, since a call with the same tensor needs the same bytes.
"""

from __future__ import annotations

import ctypes
import threading

import attrs

from ..diagnostics import KfcError
from .driver import _driver, check

TENSOR_MAP_BYTES = 128
# dtype -> (CUtensorMapDataType member, element bytes)
DTYPES = {"bf16": ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2), "f16": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2),
          "f32": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 4)}
SWIZZLES = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B", 64: "CU_TENSOR_MAP_SWIZZLE_64B",
            128: "CU_TENSOR_MAP_SWIZZLE_128B"}
MAX_BOX = 256  # the most elements a box takes along a dim


@attrs.frozen
class TiledLayout:
    """cuTensorMapEncodeTiled's arguments, innermost dim first as the driver takes them."""

    global_dim: tuple[int, int]   # (cols, rows)
    global_strides: tuple[int]    # (row pitch in bytes,)
    box_dim: tuple[int, int]      # (box_cols, box_rows)


def tiled_layout(what: str, dtype: str, shape: tuple, strides: tuple, data_ptr: int, box, swizzle: int) -> TiledLayout:
    """The layout of a [rows, cols] tensor (`strides` in elements) read in boxes of `box`
    ([box_rows, box_cols]); a KfcError naming `what` for a tensor or box a map cannot take."""
    if dtype not in DTYPES:
        raise KfcError(f"{what}: the launch contract asks for a tensor map of {dtype}; this runtime encodes "
                       f"{', '.join(DTYPES)}")
    size = DTYPES[dtype][1]
    if swizzle not in SWIZZLES or len(box) != 2 or not all(1 <= b <= MAX_BOX for b in box) \
            or box[1] * size % 16 or swizzle and box[1] * size > swizzle:
        raise KfcError(f"{what}: the launch contract's tensor map box {list(box)} with swizzle {swizzle} is not one "
                       f"TMA takes (each side 1..{MAX_BOX}, a box row a multiple of 16 bytes and at most the "
                       "swizzle's span, swizzle 0, 32, 64 or 128)", hint="this is a kfc bug: report it")
    if len(shape) != 2:
        raise KfcError(f"{what} is rank {len(shape)} {tuple(shape)}; its tensor map takes a [rows, cols] tensor")
    rows, cols = shape
    if not rows or not cols:
        raise KfcError(f"{what} is empty {tuple(shape)}; a tensor map needs at least one row and one column")
    if strides[1] != 1:
        raise KfcError(f"{what} has strides {tuple(strides)}; its tensor map needs unit stride along its rows",
                       hint="pass a contiguous tensor (.contiguous())")
    # a single row's stride is never stepped over (torch leaves it arbitrary): any multiple of 16 serves
    pitch = strides[0] * size if rows > 1 else -(-cols * size // 16) * 16
    if pitch % 16:
        per_16 = 16 // size
        raise KfcError(f"{what} has rows {pitch} bytes apart; a tensor map needs a multiple of 16",
                       hint=f"pad the row to a multiple of {per_16} {dtype} elements or pass a contiguous tensor "
                            "whose rows are")
    if data_ptr % 16:
        raise KfcError(f"{what} starts at {data_ptr:#x}, not 16-byte aligned; a tensor map needs it",
                       hint="pass a freshly allocated tensor (not a view at an offset)")
    return TiledLayout((cols, rows), (pitch,), (box[1], box[0]))


def encode(what: str, dtype: str, data_ptr: int, layout: TiledLayout, swizzle: int) -> bytes:
    """The CUtensorMap's 128 bytes, through cuda-python's cuTensorMapEncodeTiled: out-of-bounds
    reads fill zeros (a kernel's last box past the tensor's edge relies on it)."""
    drv = _driver()
    tensor_map = check(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, DTYPES[dtype][0]), 2, data_ptr,
        [drv.cuuint64_t(d) for d in layout.global_dim], [drv.cuuint64_t(s) for s in layout.global_strides],
        [drv.cuuint32_t(b) for b in layout.box_dim], [drv.cuuint32_t(1)] * 2,
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, SWIZZLES[swizzle]), drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), f"encoding the tensor map of {what}")
    return ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES)


class Encodings:
    """Encoded tensor maps by what fixes them; the oldest go past `limit` (each new allocation
    of a tensor is a new key)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._bytes: dict[tuple, bytes] = {}
        self._lock = threading.Lock()

    def get(self, what: str, t, param: dict) -> bytes:
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, tuple(param["box"]), param["swizzle"],
               t.get_device())
        hit = self._bytes.get(key)
        if hit is not None:
            return hit
        dtype = param["dtype"]
        if dtype in DTYPES and t.element_size() != DTYPES[dtype][1]:
            raise KfcError(f"{what} is {t.dtype}; its tensor map is of {dtype}")
        layout = tiled_layout(what, dtype, key[1], key[2], key[0], key[4], key[5])
        encoded = encode(what, dtype, key[0], layout, key[5])
        with self._lock:
            self._bytes[key] = encoded
            while len(self._bytes) > self.limit:
                self._bytes.pop(next(iter(self._bytes)))
        return encoded


encodings = Encodings()
