"""kfc's kernels for torch models: drop-in modules (RMSNorm, LayerNorm), functional forms
(kfc.nn.functional), the custom ops under them (kfc.nn.ops, torch.ops.kfc.*) and Kimi Delta
Attention's forward in fla's and FlashKDA's interfaces (kfc.nn.kda)."""

from . import functional, kda
from .modules import LayerNorm, RMSNorm

__all__ = ["RMSNorm", "LayerNorm", "functional", "kda"]
