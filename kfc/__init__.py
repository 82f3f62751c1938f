"""kfc, the kernel factory compiler."""

__version__ = "0.1.0"


def load(path, target=None, pipeline=None):
    """Load a .kfc file as a callable kernel (see kfc.runtime.kernel)."""
    from .runtime import load as _load

    return _load(path, target, pipeline)
