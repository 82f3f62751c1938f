"""The layout core: where each element of a tile lives, written once and used by the verifier
(a layout must agree with its launch), the interpreter (which thread reduces which elements,
in what order) and codegen (the C index expressions).

A layout in the IR is data (`Layout(kind, params)` on a tensor type); `of(layout)` gives the
object that does its arithmetic. Two kinds exist today:

    #row<threads = T, vec = V, cluster = C>   a 1-D blocked layout: the row's P = T·C lanes
        (lane g = cluster rank · T + thread) take chunks of V consecutive elements in turn, so
        element j is register (j // V // P)·V + j % V of lane (j // V) % P
    #lanes<threads = T, cluster = C>          one value per lane: the slice a row reduction
        leaves (element g is lane g's)

Shared-memory, MMA-operand, accumulator and tensor-memory layouts join this module as kinds.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from .types import Layout


@attrs.frozen
class Blocked1D:
    """#row: a row spread over P = threads · cluster lanes, `vec` elements at a time."""

    threads: int
    vec: int
    cluster: int

    KIND = "row"

    @property
    def lanes(self) -> int:
        return self.threads * self.cluster

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("threads", self.threads), ("vec", self.vec), ("cluster", self.cluster)))

    def chunks(self, n: int) -> int:
        """Chunks of `vec` elements each lane holds for a row of n (at least 1)."""
        return max(1, math.ceil(n / (self.vec * self.lanes))) if n else 1

    def exact(self, n: int) -> bool:
        """Whether every lane's every chunk lies inside a row of n (no bounds test needed)."""
        return n % (self.vec * self.lanes) == 0

    def element(self, chunk, lane, k=0):
        """The row index of element k of a lane's chunk (ints or numpy arrays)."""
        return (chunk * self.lanes + lane) * self.vec + k

    # C expressions of the same arithmetic, for codegen (the lane is the variable `lane`)
    def chunk_start_c(self, chunk: str, lane: str) -> str:
        """The row index where chunk `chunk` of lane `lane` starts."""
        return f"(({chunk} * {self.lanes} + {lane}) * {self.vec})"

    def full_chunks(self, n: int) -> int:
        """Chunks that lie inside a row of n for every lane."""
        return n // (self.vec * self.lanes)

    def in_row_c(self, chunk: str, lane: str, n: int) -> str:
        """Whether that chunk starts inside a row of n. The chunks every lane holds whole pass
        by their number alone: once a chunk loop is unrolled only the last ones test the lane,
        so a thread does not keep a bounds predicate per chunk (long rows that do not split
        evenly spilled them)."""
        test = f"(({chunk}) * {self.lanes} + {lane}) * {self.vec} < {n}"
        full = self.full_chunks(n)
        return f"(({chunk}) < {full} || {test})" if full else test

    # A CTA's part of the row: for each chunk, the `threads · vec` consecutive elements its
    # threads hold (a contiguous span; shared-memory staging copies each span in one piece)
    @property
    def span(self) -> int:
        return self.threads * self.vec

    def cta_span_start_c(self, chunk: str, rank: str) -> str:
        """The row index where CTA `rank`'s span of chunk `chunk` starts."""
        return f"(({chunk} * {self.lanes} + {rank} * {self.threads}) * {self.vec})"

    def span_length_c(self, start: str, n: int) -> str:
        """Elements of a row of n in the span that starts at `start` (the last one may be short)."""
        return f"({n} - {start} < {self.span} ? {n} - {start} : {self.span})"

    def cta_offset_c(self, chunk: str, thread: str) -> str:
        """Where chunk `chunk` of thread `thread` sits in its CTA's part of the row, spans
        stored one after another."""
        return f"(({chunk} * {self.threads} + {thread}) * {self.vec})"

    def register_element_c(self, reg: str, lane: str) -> str:
        """The row index register `reg` of lane `lane` holds."""
        return f"(({reg} / {self.vec}) * {self.lanes} + {lane}) * {self.vec} + ({reg} % {self.vec})"

    def register_in_row_c(self, reg: str, lane: str, n: int) -> str:
        """Whether register `reg` of lane `lane` holds an element of a row of n (registers of
        whole chunks pass by their number alone, as in in_row_c)."""
        test = f"({self.register_element_c(reg, lane)} < {n})"
        full = self.full_chunks(n)
        return f"(({reg}) < {full * self.vec} || {test})" if full else test

    def per_lane(self, x: np.ndarray, fill) -> np.ndarray:
        """A row as [lane, its registers in order], padded with `fill` past the row's end."""
        n, e = x.shape[0], self.chunks(x.shape[0])
        pad = np.full(e * self.lanes * self.vec, fill, dtype=np.float32)
        pad[:n] = x.astype(np.float32)
        return pad.reshape(e, self.lanes, self.vec).transpose(1, 0, 2).reshape(self.lanes, e * self.vec)


@attrs.frozen
class Lanes:
    """#lanes: one value per lane of P = threads · cluster."""

    threads: int
    cluster: int

    KIND = "lanes"

    @property
    def lanes(self) -> int:
        return self.threads * self.cluster

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("threads", self.threads), ("cluster", self.cluster)))

    def per_cta(self, x: np.ndarray) -> np.ndarray:
        """The lanes' values as [cluster rank, thread]."""
        return x.reshape(self.cluster, self.threads)


KINDS = {"row": Blocked1D, "lanes": Lanes}


def of(layout: Layout | None):
    """The arithmetic of a layout (None for a type without one)."""
    if layout is None:
        return None
    cls = KINDS.get(layout.kind)
    if cls is None:
        raise ValueError(f"no layout kind #{layout.kind}; the kinds are {', '.join('#' + k for k in KINDS)}")
    fields = [f.name for f in attrs.fields(cls)]
    params = dict(layout.params)
    if set(params) != set(fields):
        raise ValueError(f"#{layout.kind} takes {', '.join(fields)}, not {', '.join(params) or 'nothing'}")
    return cls(**params)


def disagreement(layout: Layout, launch_threads: int, launch_vec: int, launch_cluster: int) -> str | None:
    """What a #row or #lanes layout says that its launch does not ("" terms: None when they agree)."""
    core = of(layout)
    want = {"threads": launch_threads, "cluster": launch_cluster}
    if isinstance(core, Blocked1D):
        want["vec"] = launch_vec
    for key, value in want.items():
        if getattr(core, key) != value:
            return f"{key} = {getattr(core, key)}, but the gpu.launch it is in has {key} = {value}"
    return None
