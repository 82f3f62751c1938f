"""The space a tuner searches for a row op: whether rows are staged through shared memory
(`stage-rows`) and who copies them there, the options of `tile`, `lower-ptx` and whether `fuse-reductions` runs. A configuration is a dict of choices; it maps to one pipeline string,
and a pipeline string of that form maps back (others, e.g. from an agent, stay opaque).
"""

from __future__ import annotations

import math
import random
from typing import Any

import attrs

from ..passes.base import PassError
from ..passes.lower_ptx import LowerPtx
from ..passes.lower_reductions import FuseReductions
from ..passes.pipeline import parse_pipeline
from ..passes.row_cost import keeps_in_registers
from ..passes.stage_rows import COPY_GRANULE, StageRows, threshold
from ..passes.tile import MAX_ELEMS_PER_THREAD, Tile, choose

THREADS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CLUSTERS = (1, 2, 4, 8, 16)
ROWS = (0, 1, 2, 4, 8, 16, 32)
STREAM = ("cs", "nc_na", "none")
STORE = ("cs", "none")
APPROX = ("auto", "off")
# the choices that decide how a row is laid out over vector loads, threads, CTAs and clusters (and
# whether a CTA loops over rows, and where the row lives): configurations alike in these are
# variations of one kernel shape
GEOMETRY = ("threads", "vec", "cluster", "persistent", "stage")
# what a configuration recorded before a choice existed meant by leaving it out
ADDED_CHOICES = {"stage": False, "copy": "bulk"}
# who copies a staged row into shared memory (stage-rows{copy}); measured on the H200 neither wins
# everywhere (bench/results/staging_copy_ab-20261202T1700Z.json, copy_ab)
COPY = ("bulk", "threads")
# the default pipeline's passes for rows one CTA cannot hold whole (a scan, a reducing branch),
# which every configuration keeps as they are
LONG_ROW_PASSES = ("flatten-branches", "chunk-rows")


def completed(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration with the choices added since it was recorded filled in as it meant them."""
    return {**ADDED_CHOICES, **config}



class SpaceMoves:
    """What every space (this one, kfc.factory.matmul_space) does alike, given its choices(),
    valid(c), default(), pipeline(c) and config_of(pipeline)."""

    def canonical(self, pipeline: str) -> str:
        """One text per kernel: the space's form where the pipeline has one (so the default
        pipeline and its explicit spelling count as the same candidate), else the text."""
        c = self.config_of(pipeline)
        return self.pipeline(c) if c is not None else pipeline

    def random(self, rng: random.Random) -> dict[str, Any]:
        """A valid configuration drawn at random (the default when a thousand draws miss)."""
        for _ in range(1000):
            c = {k: rng.choice(v) for k, v in self.choices().items()}
            if self.valid(c):
                return c
        return self.default()

    def neighbours(self, c: dict[str, Any]) -> list[dict[str, Any]]:
        """Configurations one or two steps away in one choice (the next values up or down, or a
        flip): ordinal choices also take a longer stride."""
        out = []
        for k, values in self.choices().items():
            if c.get(k) not in values:
                continue
            i = values.index(c[k])
            for j in (i - 1, i + 1, i - 2, i + 2):
                if 0 <= j < len(values):
                    d = {**c, k: values[j]}
                    if self.valid(d):
                        out.append(d)
        return out


@attrs.frozen
class SearchSpace(SpaceMoves):
    """Choices for a row of n elements whose narrowest tensor element is `itemsize` bytes."""

    n: int
    itemsize: int = 2
    has_cluster: bool = True
    geometry: tuple[str, ...] = GEOMETRY
    reads: int = 2  # the stretches that read a staged row (kfc.passes.stage_rows.stretches)
    heavy: bool = False  # bound by issue (kfc.passes.row_cost): the default keeps short rows in registers
    load_itemsize: int = 0  # the narrowest row it loads (tile's share of a thread), if not `itemsize`

    def choices(self) -> dict[str, tuple]:
        vec_max = max(1, 16 // self.itemsize)
        threads = tuple(t for t in THREADS if t * 1 <= max(self.n, 32) and t <= 1024)
        clusters = tuple(c for c in CLUSTERS if c == 1 or (self.has_cluster and self.n >= 8192 * c // 2))
        stage = (False, True) if self.stageable else (False,)
        return {"stage": stage, "copy": COPY if self.stageable else COPY[:1], "threads": threads, "cluster": clusters,
                "rows": ROWS, "persistent": (False, True),
                "vec": tuple(v for v in (1, 2, 4, 8, 16) if v <= vec_max), "stream": STREAM, "store": STORE,
                "fuse": (True, False), "approx": APPROX}

    @property
    def stageable(self) -> bool:
        """Whether stage-rows can stage the row (its bytes a multiple of the copy granule)."""
        return (self.n * self.itemsize) % COPY_GRANULE == 0

    def stages(self, p: StageRows) -> bool:
        """Whether that stage-rows pass stages this space's row."""
        if p.heavy == "registers" and keeps_in_registers(self.heavy, self.n * (self.load_itemsize or self.itemsize)):
            return False
        return self.stageable and self.n * self.itemsize >= threshold(p.min_bytes, self.reads)

    def _choose(self, stage: bool, rows=0, threads=0, vec=0, cluster=0):
        return choose(self.n, self.itemsize, rows, threads, vec, cluster, self.has_cluster,
                      staged_bytes=self.n * self.itemsize if stage else 0, load_itemsize=self.load_itemsize)

    def default(self) -> dict[str, Any]:
        """The configuration the default pipeline's heuristics pick."""
        stage = self.stages(StageRows())
        rows, threads, vec, cluster = self._choose(stage)
        return {"stage": stage, "copy": StageRows().copy, "threads": threads, "cluster": cluster, "rows": 0,
                "persistent": False, "vec": vec, "stream": "cs", "store": "cs", "fuse": True, "approx": "auto"}

    def valid(self, c: dict[str, Any]) -> bool:
        if c["cluster"] > 1 and c["threads"] < 32:
            return False
        if c["vec"] and c["threads"] and c["cluster"] and \
                c["vec"] * math.ceil(self.n / (c["vec"] * c["threads"] * c["cluster"])) > MAX_ELEMS_PER_THREAD:
            return False  # the tile pass refuses it: the row's share would not fit in registers
        if c["rows"] and c["rows"] * c["threads"] > 1024:
            return False
        c = completed(c)
        if not c["stage"] and c["copy"] != ADDED_CHOICES["copy"]:
            return False  # nothing is copied: one spelling per kernel
        return all(c[k] in v for k, v in self.choices().items())

    def pipeline(self, c: dict[str, Any]) -> str:
        tile = [f"threads={c['threads']}", f"cluster={c['cluster']}", f"vec={c['vec']}"]
        if c["rows"]:
            tile.append(f"rows={c['rows']}")
        if c["persistent"]:
            tile.append("persistent=true")
        ptx = []
        if c["approx"] != "auto":
            ptx.append(f"approx={c['approx']}")
        if c["stream"] != "cs":
            ptx.append(f"stream={c['stream']}")
        if c["store"] != "cs":
            ptx.append(f"store={c['store']}")
        c = completed(c)
        staging = "stage-rows{min_bytes=0" + ("" if c["copy"] == "bulk" else f",copy={c['copy']}") + \
            (",heavy=stage" if self.heavy else "") + "}"
        steps = ["canonicalize", "cse", "dce", *LONG_ROW_PASSES] + ([staging] if c["stage"] else []) + \
            ["tile{" + ",".join(tile) + "}", "lower-reductions"]
        if c["fuse"]:
            steps.append("fuse-reductions")
        steps.append("lower-ptx" + ("{" + ",".join(ptx) + "}" if ptx else ""))
        steps += ["canonicalize", "cse", "dce"]
        return str(parse_pipeline(",".join(steps)))  # canonical: one text per configuration

    def config_of(self, pipeline: str) -> dict[str, Any] | None:
        """The configuration a pipeline of this space's form encodes, or None. Tile options left
        to the pass's heuristics (as in the default pipeline) are resolved the way the pass
        resolves them, so the default pipeline maps to the configuration it builds."""
        try:
            passes = list(parse_pipeline(pipeline))
        except PassError:
            return None
        at = next((i for i, p in enumerate(passes) if isinstance(p, Tile)), None)
        ptx = next((p for p in passes if isinstance(p, LowerPtx)), None)
        if at is None or ptx is None:
            return None
        staging = [p for p in passes[:at] if isinstance(p, StageRows)]
        stage = len(staging) == 1 and self.stages(staging[0])
        tile = passes[at]
        _, threads, vec, cluster = self._choose(stage, tile.rows, tile.threads, tile.vec, tile.cluster)
        copy = staging[0].copy if stage else ADDED_CHOICES["copy"]
        c = {"stage": stage, "copy": copy, "threads": threads, "cluster": cluster, "rows": tile.rows,
             "persistent": tile.persistent,
             "vec": vec, "stream": ptx.stream, "store": ptx.store, "approx": ptx.approx,
             "fuse": any(isinstance(p, FuseReductions) for p in passes)}
        if not self.valid(c):
            return None
        passes[at] = attrs.evolve(tile, threads=threads, vec=vec, cluster=cluster)
        # stage-rows as this row sees it: staging (spelled with min_bytes=0) or absent
        passes = [StageRows(min_bytes=0, copy=copy, heavy="stage" if self.heavy else "registers")
                  if isinstance(p, StageRows) else p for p in passes
                  if not isinstance(p, StageRows) or stage]
        # pipelines recorded before the long-row passes joined the default one mean the same
        # kernel at the rows they were tuned for (those passes leave short rows as they are)
        passes = [p for p in passes if str(p) not in LONG_ROW_PASSES]
        form = [p for p in parse_pipeline(self.pipeline(c)) if str(p) not in LONG_ROW_PASSES]
        return c if ",".join(map(str, form)) == ",".join(map(str, passes)) else None

    def describe(self) -> str:
        """The space in words, for a human or an agent."""
        lines = [f"row length {self.n}, narrowest element {self.itemsize} bytes; pipeline form:",
                 "  " + self.pipeline(self.default()) + "   (the default)"]
        for k, v in self.choices().items():
            lines.append(f"  {k}: {', '.join(str(x) for x in v)}")
        return "\n".join(lines)

