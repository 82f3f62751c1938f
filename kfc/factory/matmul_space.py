"""The space a tuner searches for a matrix product: the options accelerate-matmul declares, each
with the values its declared range allows (kfc.passes.base.option), less the ones that do not
change the kernel for these operands. A configuration is a dict of choices; it maps to one
pipeline string, and a pipeline of that form maps back, so the knowledge base's records and a
policy's proposals meet in one spelling.

The same interface as the row space (kfc.factory.space.SearchSpace): choices, default, valid,
pipeline, config_of, describe and `geometry`, and SpaceMoves' canonical, random and neighbours.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..ir.dtypes import DType
from ..ir.mma_ops import TMA_GRANULE
from ..passes.accelerate_matmul import AccelerateMatmul
from ..passes.matmul_match import match_matmul, tma_movable
from ..passes.base import PassError, option_range
from ..passes.pipeline import parse_pipeline
from .space import SpaceMoves

# options fixed for the search: the MMA instruction of the target, who copies (TMA where the row
# pitches allow it, which the pass decides) and approximate math (the output's precision decides)
FIXED = ("mma", "copy", "approx")
# a ranged option with more values than this is searched at powers of two
MAX_LISTED = 8


def _values(field) -> tuple:
    r = option_range(field)
    if r.choices is not None:
        return tuple(r.choices)
    if r.hi - r.lo + 1 <= MAX_LISTED:
        return tuple(range(r.lo, r.hi + 1))
    out, v = [], max(1, r.lo)
    while v <= r.hi:
        out.append(v)
        v *= 2
    return tuple(out)


DEFAULTS = {f.name: f.default for f in attrs.fields(AccelerateMatmul)}


@attrs.frozen
class MatmulSpace(SpaceMoves):
    """Choices for a product of bf16 or f16 operands whose tiles TMA can move (`tma`) on a target
    with `smem` bytes of shared memory a CTA, starting from the default pipeline's `default_pass`."""

    itemsize: int = 2
    smem: int = 227 * 1024
    tma: bool = True
    default_pass: AccelerateMatmul = AccelerateMatmul()
    tcgen05: bool = False  # Blackwell: one kernel form, tiles of 128 rows, no wgmma roles to choose
    tma_store: bool = True  # the output's rows can be stored by TMA (store=tma)
    geometry: tuple[str, ...] = ("bm", "bn", "bk", "producer", "tiles")
    sms: int = 132  # the target's SMs: a wave of one-CTA-an-SM tiles
    # the product's M, N and K as the op's dims name them (a SymDim, or a size the op fixes);
    # None where they could not be told, and then no time is scaled across shapes
    roles: tuple[Any, Any, Any] | None = None

    def choices(self) -> dict[str, tuple]:
        out = {f.name: _values(f) for f in attrs.fields(AccelerateMatmul) if f.name not in FIXED}
        if not self.tma:  # the threads copy: no producer warpgroup, and its options stay off
            out.update(producer=("mma",), inflight=(0,), registers=(0,), tiles=("grid",), consumers=("cooperative",),
                       cluster=(1,))
        if self.tcgen05:  # the options of the wgmma kernel's roles do not change the tcgen05 one
            d = self.default_pass
            out.update(bm=(128,), producer=(d.producer,), inflight=(d.inflight,), registers=(d.registers,),
                       tiles=("grid",), consumers=("cooperative",), cluster=(1,))
        # store=auto is the pass's choice between the two, made here as it makes it
        out.update(store=("direct",) if self.tcgen05 or not (self.tma_store and self.tma) else ("direct", "tma"))
        return out

    def default(self) -> dict[str, Any]:
        return self._resolved({k: getattr(self.default_pass, k) for k in self.choices()})

    def default_pipeline(self) -> str:
        """The default pipeline this space starts from, as kfc compile spells it (store=auto kept)."""
        return str(parse_pipeline(f"canonicalize,cse,dce,{self.default_pass},canonicalize,cse,dce"))

    def _resolved(self, c: dict[str, Any]) -> dict[str, Any]:
        """c with store=auto as the pass resolves it: TMA where the output and shared memory allow."""
        if c.get("store") != "auto":
            return c
        tma = {**c, "store": "tma"}
        return tma if "tma" in self.choices()["store"] and self.valid(tma) else {**c, "store": "direct"}

    def valid(self, c: dict[str, Any]) -> bool:
        if any(c.get(k) not in v for k, v in self.choices().items()):
            return False
        p = attrs.evolve(self.default_pass, **c)
        if p.options_problem():
            return False  # the pass refuses these options together
        # the pass's own reckoning of the stages and staging slots
        return p.fits_smem("tma" if self.tma else "threads", c["store"], self.itemsize, self.smem)

    def pipeline(self, c: dict[str, Any]) -> str:
        opts = ",".join(f"{k}={v}" for k, v in c.items() if v != DEFAULTS[k])
        step = "accelerate-matmul" + ("{" + opts + "}" if opts else "")
        return str(parse_pipeline(f"canonicalize,cse,dce,{step},canonicalize,cse,dce"))

    def config_of(self, pipeline: str) -> dict[str, Any] | None:
        try:
            passes = list(parse_pipeline(pipeline))
        except PassError:
            return None
        matmuls = [p for p in passes if isinstance(p, AccelerateMatmul)]
        if len(matmuls) != 1 or any(getattr(matmuls[0], k) != DEFAULTS[k] for k in ("mma", "approx")):
            return None
        written = {k: getattr(matmuls[0], k) for k in self.choices()}
        c = self._resolved(written)
        if not self.valid(c):
            return None
        # the pipeline of this form as written (store=auto included), mapped to what it builds
        return c if str(parse_pipeline(pipeline)) == self.pipeline(written) else None

    def scaled_time(self, c: dict[str, Any], us: float, there: dict[str, int],
                    here: dict[str, int]) -> float | None:
        """What a configuration timed at `us` for the shape `there` would take at `here`, by the
        model of waves: an output tile's time grows with K, and the kernel takes as many tile
        times as it has waves of tiles over the SMs (one CTA an SM; two tiles at a time under
        pingpong). Crude (it knows nothing of memory-bound tiles), but it tells a 64-row tile
        that fills one wave at 64 rows from the same tile that needs two at 128."""
        def size(role: Any, d: dict[str, int]) -> int | None:
            if isinstance(role, int):
                return role
            return None if role.name not in d else d[role.name] + role.offset

        def waves(d: dict[str, int]) -> int:
            m, n = size(self.roles[0], d), size(self.roles[1], d)
            tiles = -(-m // c["bm"]) * -(-n // c["bn"])
            return -(-tiles // (self.sms * (2 if c.get("consumers") == "pingpong" else 1)))

        if self.roles is None or any(size(r, d) is None for r in self.roles for d in (here, there)):
            return None
        k_here, k_there = size(self.roles[2], here), size(self.roles[2], there)
        return us * k_here / max(k_there, 1) * waves(here) / waves(there)

    def describe(self) -> str:
        lines = ["a matrix product on tensor cores; pipeline form:",
                 "  " + self.pipeline(self.default()) + "   (the default)"]
        lines += [f"  {k}: {', '.join(str(x) for x in v)}" for k, v in self.choices().items()]
        return "\n".join(lines)


def product_roles(func) -> tuple[Any, Any, Any] | None:
    """The product's M, N and K in `func` before its dims are fixed: each a SymDim or a size."""
    try:
        m = match_matmul(func)
    except PassError:
        return None
    a, c = m.load_a.operands[0].ttype.shape, m.store.operands[1].ttype.shape
    if len(a) != 2 or len(c) != 2:
        return None
    k = [d for d in a if d not in c]
    return (c[0], c[1], k[0]) if len(k) == 1 else None


def matmul_space(func, target, default_pipeline: str, roles: tuple[Any, Any, Any] | None = None) -> MatmulSpace:
    """The space of the matrix product in `func` (every dim fixed) on `target`; `roles` its M,
    N and K as the op names them (product_roles of the op before its dims were fixed)."""
    m = match_matmul(func)
    a = m.load_a.operands[0].ttype
    tma = tma_movable(m)
    c = m.store.operands[1].ttype
    default = next(p for p in parse_pipeline(default_pipeline) if isinstance(p, AccelerateMatmul))
    return MatmulSpace(a.dtype.itemsize, target.smem_per_block, tma, default, sms=target.sm_count, roles=roles,
                       tcgen05=default.instruction(target) == "tcgen05",
                       tma_store=c.shape[1] * c.dtype.itemsize % TMA_GRANULE == 0
                       and c.dtype in (DType.BF16, DType.F16, DType.F32))
