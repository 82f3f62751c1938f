"""Drop-in modules: torch.nn.RMSNorm and torch.nn.LayerNorm with kfc's kernels in forward and
backward. Subclasses, so the constructor, parameters, state_dict and repr are torch's own."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import functional as F


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm; forward(x, residual=None) also takes a residual to add first, and then
    returns (y, residual_out) as QuACK's fused residual norm does."""

    def forward(self, x: Tensor, residual: Optional[Tensor] = None):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps, residual=residual)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm."""

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
