"""kfc, the kernel factory compiler."""

from .model.version import __version__  # noqa: F401 - kfc.__version__


def load(path, target=None, pipeline=None, kb=None, bind=None):
    """Load a .kfc file as a callable kernel (see kfc.runtime.kernel). Without a pipeline, each
    shape compiles from the nearest record of a knowledge base where one qualifies
    (kfc.kb.advice), said on stderr and kept in the kernel's `advised`: `kb` names it (a path or
    URL), None takes the default one ($KFC_KB, else ~/.cache/kfc/kb.sqlite) where it exists, and
    False none. `bind` gives type parameters a value, e.g. a size:
    kfc.load("kernels/kda_fwd.kfc", bind={"C": 32})."""
    from .runtime import load as _load  # lazy: kfc.runtime pulls kfc.ir, ml_dtypes ~2.5 s; import kfc stays light

    advisor = None
    if kb is not False and pipeline is None:
        from .kb.advice import advise_from  # lazy: kfc.kb pulls kfc.ir ~2 s; import kfc stays light

        def advisor(func, target_name, dims):
            return advise_from(kb, func, target_name, dims)
    return _load(path, target, pipeline, advisor, bind)
