"""kfc's kernels for torch models: drop-in modules (RMSNorm, LayerNorm), functional forms
(kfc.nn.functional) and the custom ops under them (kfc.nn.ops, torch.ops.kfc.*)."""

from . import functional
from .modules import LayerNorm, RMSNorm

__all__ = ["RMSNorm", "LayerNorm", "functional"]
