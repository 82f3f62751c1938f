"""The CUDA driver through cuda-python, for what the runtime's ctypes calls (kfc.runtime.launcher,
which loads and launches) do not cover: encoding TMA tensor maps (kfc.runtime.tensor_maps).
Without cuda-python, the first call raises one clear GpuUnavailable.
"""

from __future__ import annotations

from ..diagnostics import GpuUnavailable, KfcError


def _driver():
    try:
        from cuda.bindings import driver  # lazy: cuda-python ~0.26 s cold (importtime), for TMA tensor maps only
    except ImportError:
        try:
            from cuda import cuda as driver  # lazy: as above, an older cuda-python
        except ImportError:
            raise GpuUnavailable("cuda-python is not installed", hint="pip install cuda-python") from None
    return driver


def check(result, what: str):
    """Unpack a cuda-python (err, *values) tuple, raising on error."""
    drv = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        text = msg.decode() if isinstance(msg, bytes) else str(msg)
        raise KfcError(f"CUDA error in {what}: {err.name if hasattr(err, 'name') else err}: {text}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)
