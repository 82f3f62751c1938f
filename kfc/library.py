"""The kernels kfc ships (kernels/*.kfc), from the source tree or the installed package, loaded
once per process."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from .diagnostics import KfcError

_SOURCE_DIR = Path(__file__).resolve().parent.parent / "kernels"


def kernel_path(name: str) -> Path:
    path = _SOURCE_DIR / f"{name}.kfc"
    if path.is_file():
        return path
    try:
        installed = resources.files("kfc.kernels").joinpath(f"{name}.kfc")
    except ModuleNotFoundError:
        installed = None
    if installed is None or not installed.is_file():
        raise KfcError(f"kfc ships no kernel named {name!r}")
    return Path(str(installed))


@functools.cache
def kernel(name: str, pipeline: str | None = None, **bind):
    """The shipped kernel `name` as a callable (kfc.runtime.kernel.KfcKernel), its type
    parameters given by `bind` where named (kernel("kda_fwd_fla", C=16)), built by `pipeline`
    where given, else by the default."""
    from .runtime.kernel import load  # lazy: kfc.runtime pulls kfc.ir, ml_dtypes ~2.5 s; kernel_path() needs neither

    return load(kernel_path(name), pipeline=pipeline, bind=bind or None)
