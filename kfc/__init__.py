"""kfc, the kernel factory compiler."""

from .model.version import __version__  # noqa: F401 - kfc.__version__


def load(path, target=None, pipeline=None):
    """Load a .kfc file as a callable kernel (see kfc.runtime.kernel)."""
    from .runtime import load as _load  # lazy: kfc.runtime pulls kfc.ir, ml_dtypes ~2.5 s; import kfc stays light

    return _load(path, target, pipeline)
