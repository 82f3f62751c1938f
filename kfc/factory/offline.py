"""The offline search policy (the default; no network).

It proposes, in order:
  1. the knowledge base's prior: the configurations recorded for this op at this target and
     shape, fastest first, then those of similar ops (transfer: a layernorm's tile at N=16384 is
     a good first guess for a softmax at N=16384), hedged: the best of each near-best basin
     (launch geometry) of theirs first, since which basin wins is what differs between ops;
  2. the pass-sequence graph's recombination: the `tile` step, the `lower-ptx` step and the
     choice of `fuse-reductions` that paid off best on average (mean speedup over their own
     op's baseline), from whichever trials they come;
  3. candidates ranked by a model fitted to every trial of this op and the prior's: log time,
     centred per op, as a sum of one effect per (choice, value), a similar op's trials counting
     for less than this op's own, optimistic for values seen rarely.
     The pool holds the model's best guess (each choice at its best-looking value) and the
     one-step neighbours of the best configurations so far;
  4. random configurations, with probability `explore`, and whenever there is nothing else.
With an empty knowledge base it starts from the default pipeline's configuration (timed first,
as the baseline, by the tuner) and its neighbours, and keeps stepping from that configuration
as well as from the best ones so far: it is this op's known-good basin, which another op's
optimum may not share.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from .model import TuneContext
from ..model.records import Proposal, Stage, Trial
from ..kb.graph import paying_steps
from ..kb.rows import canonical_shape


class SearchPolicy:
    name = "search"

    def __init__(self, seed: int = 0, explore: float = 0.15, width: int = 3, bonus: float = 0.5,
                 transfer: float = 0.5, joint: bool = False, ridge: float = 1.0,
                 anchor: bool = True, basin_tolerance: float = 0.05, basin_distance: int = 2,
                 replay_tolerance: float = 0.10) -> None:
        self.rng = random.Random(seed)
        self.joint = joint          # fit the effects jointly (ridge) rather than as per-value means
        self.ridge = ridge
        self.anchor = anchor        # also step from the default pipeline's configuration
        self.basin_tolerance = basin_tolerance  # a similar op's configuration this near its best...
        self.basin_distance = basin_distance    # ...and this far from the others is a basin to try
        # a similar op's configuration slower than its op's best by more than this is not tried
        # as it is (it still informs the model): a warm tune that replayed a whole record of
        # other shapes spent its budget re-timing their slow corners
        self.replay_tolerance = replay_tolerance
        self.transfer = transfer    # weight of a similar op's trial against one of this op's own
        self.explore = explore
        self.width = width          # how many of the best configurations to move around
        self.bonus = bonus          # optimism for values tried rarely, in standard deviations

    # --- the model: log time as a sum of per-choice effects -------------------------------------
    def observations(self, ctx: TuneContext) -> list[tuple[dict, float | None, float]]:
        """(configuration, log-time deviation, weight) per trial of this op and of the prior.

        Trials of similar ops and of this op's other runs (prior trials not in this run's
        history) are centred on their own mean, one per op and shape, and weighted by
        `transfer`: another op or shape may be uniformly slower or faster, and what it says
        about a choice is a hint that this run's own measurements outweigh. A failed trial's
        deviation is None."""
        own_ids = {t.candidate_id for t in ctx.history}
        groups: dict[Any, list[tuple[dict, float | None]]] = defaultdict(list)
        for t in list(ctx.history) + [t for t in ctx.prior if t.candidate_id not in own_ids]:
            c = ctx.space.config_of(t.proposal.pipeline)
            if c is None:
                continue
            timed = t.outcome.stage is Stage.TIMED and t.outcome.median_us
            # one centre per op and shape: an op's records at 4096^3 and at 64 rows differ by 4x
            # whatever the configuration, which one centre would charge to the choices tried there
            shape = None if t.shape is None else canonical_shape(t.shape)
            key = "own" if t.candidate_id in own_ids else (t.op_id, shape)
            groups[key].append((c, math.log(t.outcome.median_us) if timed else None))
        out = []
        for key, ys in groups.items():
            logs = [y for _, y in ys if y is not None]
            centre = sum(logs) / len(logs) if logs else 0.0
            w = 1.0 if key == "own" else self.transfer
            out += [(c, None if y is None else y - centre, w) for c, y in ys]
        return out

    def fit(self, ctx: TuneContext) -> tuple[float, float, dict, dict]:
        """(0, spread, effect, count) of centred log(time) over `observations`, effect[(choice,
        value)] being the weighted mean deviation of trials with that value."""
        obs = self.observations(ctx)
        devs = [d for _, d, _ in obs if d is not None]
        if not devs:
            return 0.0, 1.0, {}, {}
        spread = (sum(d * d for d in devs) / len(devs)) ** 0.5 or 0.1
        worst = max(devs) + spread  # failures count as slower than anything timed
        sums: dict = defaultdict(float)
        weights: dict = defaultdict(float)
        counts: dict = defaultdict(int)
        for c, d, w in obs:
            for k, v in c.items():
                sums[(k, v)] += w * (worst if d is None else d)
                weights[(k, v)] += w
                counts[(k, v)] += 1
        if not self.joint:
            return 0.0, spread, {a: sums[a] / weights[a] for a in weights}, counts
        return 0.0, spread, self._joint_effects(obs, worst, list(weights)), counts

    def _joint_effects(self, obs, worst: float, columns: list) -> dict:
        """Effects fitted jointly (weighted ridge regression on one-hot choices): a slow trial's
        blame is shared by the choices that explain it across all trials, not charged in full to
        each of its values as a per-value mean does."""
        index = {a: i for i, a in enumerate(columns)}
        x = np.zeros((len(obs), len(columns)))
        y = np.empty(len(obs))
        w = np.empty(len(obs))
        for r, (c, d, wt) in enumerate(obs):
            for k, v in c.items():
                x[r, index[(k, v)]] = 1.0
            y[r] = worst if d is None else d
            w[r] = wt
        xtw = x.T * w
        beta = np.linalg.solve(xtw @ x + self.ridge * np.eye(len(columns)), xtw @ y)
        return {a: float(beta[i]) for a, i in index.items()}

    @staticmethod
    def importance(model) -> dict[str, float]:
        """How much each choice has mattered: the range of its values' effects, in units of the
        spread; 1 for a choice not yet seen at two values twice (unknown: worth learning)."""
        mean, spread, effect, counts = model
        seen: dict = defaultdict(list)
        for (k, v), e in effect.items():
            if counts[(k, v)] >= 2:
                seen[k].append(e)
        return {k: min(1.0, (max(es) - min(es)) / spread) if len(es) >= 2 else 1.0 for k, es in seen.items()}

    def predict(self, c: dict[str, Any], model, importance: dict[str, float] | None = None) -> float:
        """Predicted log time, optimistic for values seen rarely in choices that matter (lower
        is better)."""
        mean, spread, effect, counts = model
        importance = importance if importance is not None else self.importance(model)
        y = mean
        for k, v in c.items():
            n = counts.get((k, v), 0)
            y += effect.get((k, v), 0.0) - self.bonus * spread * importance.get(k, 1.0) / math.sqrt(n + 1)
        return y

    # --- proposals ----------------------------------------------------------------------------
    def propose(self, ctx: TuneContext, n: int) -> list[Proposal]:
        space = ctx.space
        tried = {space.canonical(t.proposal.pipeline) for t in ctx.history}
        out: list[Proposal] = []

        def add(c: dict, why: str) -> None:
            p = space.pipeline(c)
            if p not in tried and space.valid(c):
                tried.add(p)
                out.append(Proposal(p, why, "search"))

        model = self.fit(ctx)
        imp = self.importance(model)
        for c, t, why in self.prior_order(ctx):  # 1. what the knowledge base already knows
            if len(out) >= n:
                return out
            sp = f", {t.outcome.speedup:.2f}x its baseline" if t.outcome.speedup else ""
            add(c, f"prior from the knowledge base ({t.outcome.median_us:.1f} us{sp}; {why})")
        graph_pick = graph_proposal(ctx)  # 2. recombination: each pass's best-paying step
        if graph_pick is not None and len(out) < n:
            c, why = graph_pick
            add(c, why)
        # the best configurations so far, each against its own op's mean
        starts = [c for c, d, _ in sorted((o for o in self.observations(ctx) if o[1] is not None),
                                          key=lambda o: o[1])][: self.width]
        if self.anchor:  # the default pipeline's configuration: this op's own known-good basin
            base = next((ctx.space.config_of(t.proposal.pipeline) for t in ctx.history
                         if t.proposal.proposer == "baseline"), None)
            if base is not None and base not in starts:
                starts.append(base)
        pool: list[tuple[float, dict, str]] = []
        if model[2]:  # 2. the model's own best guess: every choice at its best-looking value
            guess = {k: min(vals, key=lambda v: self.predict({k: v}, model, imp)) for k, vals in space.choices().items()}
            pool.append((self.predict(guess, model, imp), guess, "the model's best guess: each choice at its best value"))
        for c in starts:  # 3. steps around the best so far
            for d in space.neighbours(c):
                changed = ", ".join(f"{k}={d[k]}" for k in d if d[k] != c[k])
                pool.append((self.predict(d, model, imp), d, f"a step from a best configuration: {changed}"))
        pool.sort(key=lambda m: m[0])
        for _, d, why in pool:
            if len(out) >= n:
                break
            if self.rng.random() < self.explore:
                add(space.random(self.rng), "exploration: a random configuration")
            add(d, why)
        for _ in range(200):  # 4. random configurations
            if len(out) >= n:
                break
            add(space.random(self.rng), "exploration: a random configuration")
        return out[:n]

    def prior_order(self, ctx: TuneContext) -> list[tuple[dict, Trial, str]]:
        """The prior's configurations in the order to try them: this op's own first (at this
        shape fastest first, then its other shapes', `own_order`); then similar ops', hedged
        across basins.

        A similar op's optimum may not be this op's: at a long row one op wants persistent
        clusters of 2 while another wants clusters of 8 that are not persistent, and a similar
        op's record can show both as near-best. So the best of each basin comes first, ranked by
        how close to its own op's best it ran; then the best of each other layout in that basin;
        then the rest within `replay_tolerance` of their op's best, in the same ranking. A basin's best is a configuration within
        `basin_tolerance` of its op's best whose launch geometry (the space's `geometry` choices)
        differs from every one taken before in at least `basin_distance` choices; a layout's, one
        that differs in at least one. Details (streaming hints, rows per CTA, fusion) are left to
        the model: they move a kernel by a few percent, a layout by tens of percent for one op
        and not another (softmax at N=16384 runs 20% faster with 2-wide loads than 4-wide; the
        norms barely notice)."""
        own_ids = {t.candidate_id for t in ctx.history}
        own_op = {t.op_id for t in ctx.history if t.op_id is not None}
        own, other = [], []
        for t in ctx.prior:
            c = ctx.space.config_of(t.proposal.pipeline)
            if c is not None and t.outcome.median_us:
                (own if t.candidate_id in own_ids or t.op_id in own_op else other).append((c, t))
        own = self.own_order(ctx, own)
        best: dict = {}
        for _, t in other:
            best[t.op_id] = min(best.get(t.op_id, math.inf), t.outcome.median_us)
        def rel(t: Trial) -> float:  # how near its own op's best it ran
            return t.outcome.median_us / best[t.op_id]

        other.sort(key=lambda ct: rel(ct[1]))
        geometry = ctx.space.geometry
        near = [(c, t) for c, t in other if rel(t) <= 1 + self.basin_tolerance]
        heads: list[tuple[dict, Trial, str]] = []
        for level in range(self.basin_distance, 0, -1):
            for c, t in near:
                if all(sum(c[k] != h[k] for k in geometry) >= level for h, _, _ in heads):
                    kind = "the best of a basin" if level == self.basin_distance else "the best of a layout"
                    heads.append((c, t, f"{kind}, {rel(t):.3f}x its op's best"))
        head_ids = {t.candidate_id for _, t, _ in heads}
        rest = [(c, t, f"a similar op's, {rel(t):.3f}x its best") for c, t in other
                if t.candidate_id not in head_ids and rel(t) <= 1 + self.replay_tolerance]
        return own + heads + rest

    def own_order(self, ctx: TuneContext, own: list[tuple[dict, Trial]]) -> list[tuple[dict, Trial, str]]:
        """This op's records: those at this shape first, as the knowledge base ranks them; then
        each other shape's, nearest shape first, ranked within the shape by the time the space
        expects of them here (`scaled_time`, where the space has one: a GEMM's waves of tiles),
        else as the knowledge base ranks them. The fastest configuration at 64 rows may need
        twice the waves at 128 where the second fastest needs the same; across shapes the
        expectation is not trusted (a model of waves has a compute-bound 4096³ tile beating a
        memory-bound skinny one), so the nearest shape still comes first."""
        here = [(c, t, "this op's own record") for c, t in own if t.shape is None or t.shape == ctx.shape]
        groups: dict[str, list[tuple[dict, Trial]]] = {}
        for c, t in own:
            if t.shape is not None and t.shape != ctx.shape:
                groups.setdefault(canonical_shape(t.shape), []).append((c, t))
        scale = getattr(ctx.space, "scaled_time", None)
        out = here
        for group in groups.values():  # in the knowledge base's order: the nearest shape first
            there = ",".join(f"{k}={v}" for k, v in group[0][1].shape.items())
            expected = [scale(c, t.outcome.median_us, t.shape, ctx.shape) if scale else None for c, t in group]
            ranked = list(zip(expected, group))
            if None not in expected:
                ranked.sort(key=lambda eg: eg[0])
            for e, (c, t) in ranked:
                why = f"this op's record at {there}" + (f", {e:.1f} us expected here" if e else "")
                out.append((c, t, why))
        return out

    def reflect(self, ctx: TuneContext, trials: Sequence[Trial]) -> list[str]:
        """Lessons from the model: a choice whose best and worst values differ by over 15%."""
        mean, spread, effect, counts = self.fit(ctx)
        by_choice: dict = defaultdict(list)
        for (k, v), e in effect.items():
            if counts[(k, v)] >= 3:
                by_choice[k].append((e, v))
        lessons = []
        for k, vals in sorted(by_choice.items()):
            if len(vals) >= 2:
                vals.sort()
                (lo, vlo), (hi, vhi) = vals[0], vals[-1]
                if math.exp(hi - lo) > 1.15:
                    lessons.append(f"{ctx.op_name} {ctx.shape} on {ctx.target}: {k}={vlo} ran about "
                                   f"{math.exp(hi - lo):.2f}x faster than {k}={vhi} on average")
        return lessons


def graph_proposal(ctx: TuneContext) -> tuple[dict[str, Any], str] | None:
    """A configuration from the pass-sequence graph: the `tile` and `lower-ptx` steps with the
    highest mean speedup, and `fuse-reductions` if the trials through it paid off better on
    average than those around it. None when the graph has no timed speedups yet or the
    recombination is not a point of the space."""
    graph = ctx.graph()

    def best(name: str) -> tuple[str, dict] | None:
        steps = paying_steps(graph, name)
        return steps[0] if steps else None

    tile, ptx = best("tile"), best("lower-ptx")
    if tile is None or ptx is None:
        return None
    # fuse-reductions: the edge into it against the other ways out of lower-reductions
    fused = without = None
    if "lower-reductions" in graph:
        outs = [(b, d) for b, d in graph.succ["lower-reductions"].items() if d.get("mean_speedup") is not None]
        fused = next((d["mean_speedup"] for b, d in outs if b == "fuse-reductions"), None)
        rest = [(d["mean_speedup"], d["timed"]) for b, d in outs if b != "fuse-reductions"]
        without = sum(m * k for m, k in rest) / sum(k for _, k in rest) if rest and sum(k for _, k in rest) else None
    fuse = fused is not None and (without is None or fused >= without)
    steps = ["canonicalize", "cse", "dce", tile[0], "lower-reductions"] + (["fuse-reductions"] if fuse else [])
    c = ctx.space.config_of(",".join(steps + [ptx[0], "canonicalize", "cse", "dce"]))
    if c is None:
        return None
    why = (f"the pass-sequence graph: {tile[0]} (mean {tile[1]['mean_speedup']:.2f}x over {tile[1]['timed']} "
           f"trials) with {ptx[0]} (mean {ptx[1]['mean_speedup']:.2f}x), {'with' if fuse else 'without'} fuse-reductions")
    return c, why
