"""The one rule by which an output matches its reference, for numpy arrays and torch tensors
alike (kfc check, --verify-each, the evaluation gate and the benchmarks all use it).

An output of tolerance `tol` matches when it has no NaN/inf where the reference is finite (and
equals the reference where it is not), its RMSE relative to the reference's RMS is at most tol,
and every element is within tol * (|ref| + rms(ref)). A tolerance of 0 asks for equality (for
integers). The caller picks the precision: both arrays are compared as given.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy


@attrs.frozen
class Comparison:
    ok: bool
    max_abs: float                    # largest |out - ref| over the finite reference
    rel_rmse: float                   # RMSE over the reference's RMS
    worst: float                      # largest |out - ref| / (|ref| + rms(ref))
    unwritten: int = 0                # NaN/inf where the reference is finite
    special_mismatch: int = 0         # elements differing where the reference is NaN/inf
    beyond: int = 0                   # elements outside tol * (|ref| + rms(ref))
    first_bad: tuple[int, ...] = ()   # the first failing element, else the largest difference
    shape_mismatch: str = ""


def _xp(a: Any):
    if type(a).__module__.startswith("torch"):
        import torch  # lazy: torch (~3 s), loaded already when the arrays are torch tensors

        return torch

    return numpy


def _index(xp, mask) -> tuple[int, ...]:
    hits = xp.argwhere(mask)
    return tuple(int(i) for i in hits[0]) if len(hits) else ()


def compare_arrays(out: Any, ref: Any, tol: float) -> Comparison:
    """Compare `out` with `ref` (same kind: two numpy arrays or two torch tensors)."""
    xp = _xp(out)
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, math.inf, math.inf, math.inf,
                          shape_mismatch=f"shape {list(out.shape)} where {list(ref.shape)} is expected")
    if out.numel() == 0 if xp.__name__ == "torch" else out.size == 0:
        return Comparison(True, 0.0, 0.0, 0.0)
    finite = xp.isfinite(ref)
    out_finite = xp.isfinite(out)
    unwritten = ~out_finite & finite
    special = ~finite & ~((out == ref) | (xp.isnan(out) & xp.isnan(ref)))
    n_unwritten, n_special = int(unwritten.sum()), int(special.sum())
    both = finite & out_finite
    # scalars, not full-size zeros: a huge check on the GPU keeps few temporaries alive
    diff = xp.abs(xp.where(both, out, 0.0) - xp.where(both, ref, 0.0))  # no inf - inf
    r = xp.where(finite, ref, 0.0)
    norm = float(xp.sqrt(xp.mean(r * r)))
    max_abs = float(diff.max())
    rel = float(xp.sqrt(xp.mean(diff * diff))) / norm if norm > 0 else (0.0 if max_abs == 0 else math.inf)
    scale = xp.abs(r) + norm
    del r
    worst = float((diff / xp.where(scale > 0, scale, 1.0)).max()) if norm > 0 else max_abs
    beyond = diff > tol * scale if tol > 0 else diff > 0
    del scale
    n_beyond = int(beyond.sum())
    bad = beyond | unwritten | special
    if n_unwritten or n_special:
        max_abs = rel = worst = math.inf
    ok = not (n_unwritten or n_special or n_beyond) and (tol == 0 or rel <= tol)
    first = _index(xp, bad) if bool(bad.any()) else tuple(
        int(i) for i in _unravel(int(xp.argmax(diff.reshape(-1))), tuple(diff.shape)))
    return Comparison(ok, max_abs, rel, worst, n_unwritten, n_special, n_beyond, first)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat //= size if size else 1
    return tuple(reversed(out))
