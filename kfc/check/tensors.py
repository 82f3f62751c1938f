"""numpy <-> torch for every kfc dtype (torch cannot wrap ml_dtypes arrays directly)."""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType

# dtypes numpy holds through ml_dtypes travel as raw bits of the same width
_VIEW_AS = {DType.BF16: np.uint16, DType.E4M3: np.uint8, DType.E5M2: np.uint8}


def to_torch(arr: np.ndarray, dtype: DType):
    import torch

    if dtype in _VIEW_AS:
        raw = np.ascontiguousarray(arr).view(_VIEW_AS[dtype])
        return torch.from_numpy(raw.copy()).view(dtype.torch)
    return torch.from_numpy(np.ascontiguousarray(arr).copy())


def to_numpy(t, dtype: DType | None = None) -> np.ndarray:
    """A torch tensor as numpy: in kfc dtype `dtype`'s exact numpy form when given, else with
    narrow floats widened to fp32."""
    import torch

    t = t.detach().cpu()
    if dtype is None:
        if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
            t = t.float()
        return t.numpy()
    t = t.to(dtype.torch).contiguous()
    if dtype in _VIEW_AS:
        bits = torch.int16 if _VIEW_AS[dtype] is np.uint16 else torch.uint8
        return t.view(bits).numpy().view(_VIEW_AS[dtype]).view(dtype.np)
    return t.numpy()
