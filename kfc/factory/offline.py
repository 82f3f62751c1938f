"""The offline search policy (the default; no network).

It proposes, in order:
  1. the knowledge base's prior: the best configurations recorded for this op at this target
     and shape, then those of similar ops (transfer: a layernorm's tile at N=16384 is a good
     first guess for a softmax at N=16384);
  2. candidates ranked by a model fitted to every timed trial (this run's and the prior's):
     log time as a sum of one effect per (choice, value), optimistic for values seen rarely.
     The pool holds the model's best guess (each choice at its best-looking value) and the
     one-step neighbours of the best configurations so far;
  3. random configurations, with probability `explore`, and whenever there is nothing else.
With an empty knowledge base it starts from random configurations: it knows nothing of kfc's
hand-written heuristics (the tuner measures those separately, as the baseline).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any, Sequence

from .model import Proposal, Stage, Trial, TuneContext


def _timed(trials: Sequence[Trial]) -> list[Trial]:
    return [t for t in trials if t.outcome.stage is Stage.TIMED and t.outcome.median_us]


class SearchPolicy:
    name = "search"

    def __init__(self, seed: int = 0, explore: float = 0.15, width: int = 3, bonus: float = 0.5) -> None:
        self.rng = random.Random(seed)
        self.explore = explore
        self.width = width          # how many of the best configurations to move around
        self.bonus = bonus          # optimism for values tried rarely, in standard deviations

    # --- the model: log time as a sum of per-choice effects -------------------------------------
    def fit(self, ctx: TuneContext) -> tuple[float, float, dict, dict]:
        """(mean, spread, effect, count) of log(time) over timed trials of this run and the prior,
        effect[(choice, value)] being the mean deviation of trials with that value."""
        ys: list[tuple[dict, float]] = []
        for t in list(ctx.prior) + list(ctx.history):
            c = ctx.space.config_of(t.proposal.pipeline)
            if c is not None and t.outcome.stage is Stage.TIMED and t.outcome.median_us:
                ys.append((c, math.log(t.outcome.median_us)))
            elif c is not None and t.outcome.stage is not Stage.TIMED:
                ys.append((c, None))  # failures count as slow, below
        timed = [y for _, y in ys if y is not None]
        if not timed:
            return 0.0, 1.0, {}, {}
        mean = sum(timed) / len(timed)
        spread = (sum((y - mean) ** 2 for y in timed) / len(timed)) ** 0.5 or 0.1
        worst = max(timed) + spread
        sums: dict = defaultdict(float)
        counts: dict = defaultdict(int)
        for c, y in ys:
            y = worst if y is None else y
            for k, v in c.items():
                sums[(k, v)] += y - mean
                counts[(k, v)] += 1
        return mean, spread, {a: sums[a] / counts[a] for a in counts}, counts

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
        tried = {t.proposal.pipeline for t in ctx.history}
        out: list[Proposal] = []

        def add(c: dict, why: str) -> None:
            p = space.pipeline(c)
            if p not in tried and space.valid(c):
                tried.add(p)
                out.append(Proposal(p, why, "search"))

        for t in ctx.prior:  # 1. what the knowledge base already knows
            if len(out) >= n:
                return out
            c = space.config_of(t.proposal.pipeline)
            if c is not None:
                sp = f", {t.outcome.speedup:.2f}x its baseline" if t.outcome.speedup else ""
                add(c, f"prior from the knowledge base ({t.outcome.median_us:.1f} us{sp})")
        model = self.fit(ctx)
        imp = self.importance(model)
        starts = [space.config_of(t.proposal.pipeline) for t in
                  sorted(_timed(list(ctx.history) + list(ctx.prior)), key=lambda t: t.outcome.median_us)]
        starts = [c for c in starts if c is not None][: self.width]
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
