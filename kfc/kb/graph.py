"""Pass sequences as a graph with payoff statistics: what policies read to decide what to try next.

`pipeline_graph(trials)` builds a `networkx.DiGraph` whose nodes are pipeline steps — a pass
with its options as the pipeline printer writes it, e.g. `tile{threads=128,vec=8,cluster=1}` —
plus a `START` node before every pipeline and an `END` node after it. Each trial adds an edge
for every consecutive pair of steps of its pipeline (START → first, …, last → END); a step or
transition a pipeline uses twice (`canonicalize` at both ends) counts once for that trial.

Every node and edge carries, over the trials that use it:

    count          trials
    timed          trials that reached Stage.TIMED
    timed_rate     timed / count
    best_speedup   largest speedup of a timed trial (None if no timed trial has one)
    mean_speedup   mean speedup over the timed trials that have one (None if none)
    best_us        lowest median time of a timed trial (only comparable within one op and shape)
    best_candidate the candidate id of the trial behind best_speedup (else best_us)
    errors         trials that recorded an error

The graph is first-order: `best_steps` looks only at the last step of a prefix.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

from ..diagnostics import KfcError
from ..model.records import Stage, Trial
from ..passes.pipeline import parse_pipeline

START = "START"
END = "END"
_STATS = ("count", "timed", "timed_rate", "best_speedup", "mean_speedup", "best_us", "best_candidate", "errors")


def split_pipeline(pipeline: str) -> list[str]:
    """The steps of a pipeline in canonical text; a text that does not parse is split at the
    commas outside braces, as written."""
    try:
        return [str(p) for p in parse_pipeline(pipeline)]
    except KfcError:
        return [s.strip() for s in re.split(r",(?![^{}]*\})", pipeline) if s.strip()]


def _canonical_step(step: Any) -> str:
    text = str(step)
    if text in (START, END):
        return text
    steps = split_pipeline(text)
    return steps[0] if len(steps) == 1 else text


class _Acc:
    def __init__(self) -> None:
        self.count = 0
        self.timed = 0
        self.errors = 0
        self.speedups: list[float] = []
        self.best_us: float | None = None
        self.best_by_speedup: tuple[float, int] | None = None
        self.best_by_us: tuple[float, int] | None = None

    def add(self, t: Trial) -> None:
        o = t.outcome
        self.count += 1
        if o.error:
            self.errors += 1
        if o.stage is not Stage.TIMED:
            return
        self.timed += 1
        if o.speedup is not None:
            self.speedups.append(o.speedup)
            if self.best_by_speedup is None or o.speedup > self.best_by_speedup[0]:
                self.best_by_speedup = (o.speedup, t.candidate_id)
        if o.median_us is not None and (self.best_by_us is None or o.median_us < self.best_by_us[0]):
            self.best_by_us = (o.median_us, t.candidate_id)

    def stats(self) -> dict[str, Any]:
        best = self.best_by_speedup or self.best_by_us
        return {
            "count": self.count,
            "timed": self.timed,
            "timed_rate": self.timed / self.count if self.count else 0.0,
            "best_speedup": max(self.speedups) if self.speedups else None,
            "mean_speedup": sum(self.speedups) / len(self.speedups) if self.speedups else None,
            "best_us": self.best_by_us[0] if self.best_by_us else None,
            "best_candidate": best[1] if best else None,
            "errors": self.errors,
        }


def pipeline_graph(trials: Iterable[Trial]) -> nx.DiGraph:
    """The graph of pass sequences of these trials, with payoff statistics (see the module doc).
    `graph.graph` holds `trials` and `timed`, the totals."""
    nodes: dict[str, _Acc] = {}
    edges: dict[tuple[str, str], _Acc] = {}
    order: list[str] = [START, END]
    total = timed = 0
    for t in trials:
        total += 1
        timed += t.outcome.stage is Stage.TIMED
        path = [START, *split_pipeline(t.proposal.pipeline), END]
        for step in dict.fromkeys(path):
            if step not in nodes:
                nodes[step] = _Acc()
                if step not in order:
                    order.append(step)
            nodes[step].add(t)
        for edge in dict.fromkeys(itertools.pairwise(path)):
            edges.setdefault(edge, _Acc()).add(t)
    g = nx.DiGraph(trials=total, timed=timed)
    for step in order:
        g.add_node(step, **(nodes[step].stats() if step in nodes else _Acc().stats()))
    for (a, b), acc in edges.items():
        g.add_edge(a, b, **acc.stats())
    return g


def step_payoff(graph: nx.DiGraph, step: Any) -> dict[str, Any]:
    """The statistics of one step (text or a Pass; options in any order), plus `step`; zeros
    for a step the graph has never seen."""
    key = _canonical_step(step)
    data = graph.nodes[key] if key in graph else _Acc().stats()
    return {"step": key, **{k: data.get(k) for k in _STATS}}


def _rank(stats: dict[str, Any]) -> tuple:
    def num(x, missing):
        return missing if x is None else x

    return (stats["timed"] > 0, num(stats["best_speedup"], -1.0), num(stats["mean_speedup"], -1.0),
            -num(stats["best_us"], float("inf")), stats["timed_rate"], stats["count"])


def best_steps(graph: nx.DiGraph, prefix: str | Sequence[Any] | None = None,
               k: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """Up to k steps to try after `prefix` (a pipeline string, a list of steps, or None/"" for the
    first step), best first, each as (step, statistics of the edge into it). Best means: reached
    TIMED at all, then the higher best speedup, the higher mean speedup, the lower best time,
    the higher timed rate, the more trials. `END` among them means "stop here". A prefix
    whose last step the graph has never seen gives []."""
    if prefix is None or (isinstance(prefix, str) and not prefix.strip()):
        last = START
    elif isinstance(prefix, str):
        last = split_pipeline(prefix)[-1]
    else:
        steps = list(prefix)
        last = _canonical_step(steps[-1]) if steps else START
    if last not in graph:
        return []
    ranked = sorted(((b, {k2: graph.edges[last, b].get(k2) for k2 in _STATS}) for b in graph.successors(last)),
                    key=lambda item: _rank(item[1]), reverse=True)
    return ranked[:max(k, 0)]


def paying_steps(graph: nx.DiGraph, name: str) -> list[tuple[str, dict[str, Any]]]:
    """The steps of one pass (with any options, e.g. every `tile{...}`) that have a mean
    speedup, best paying first (ties: more timed trials first), each with its statistics."""
    steps = [(n, d) for n, d in graph.nodes(data=True)
             if (n == name or n.startswith(name + "{")) and d.get("mean_speedup") is not None]
    return sorted(steps, key=lambda nd: (nd[1]["mean_speedup"], nd[1]["timed"]), reverse=True)
