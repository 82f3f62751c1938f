"""The roles of a warp-specialised program (gpu.roles) run by the interpreter as coroutines: one
runs at a time, and at every protocol op it may hand over to another, in an order a seeded
random generator picks (each seed also makes some roles run faster than others). A role waiting on an mbarrier whose phase cannot end yet is not picked
until it can; when every unfinished role waits so, the program deadlocks, and the first waiting
role's wait says why. Running one program under several seeds tries several interleavings of
the same protocol: what a hazard check finds under one of them, the GPU could do.

Python threads carry the coroutines (the interpreter recurses through nested regions, which a
generator cannot suspend), but the scheduler lets only the thread holding the turn run.
"""

from __future__ import annotations

import random
import threading
from typing import Callable

from ...diagnostics import KfcError


class _Aborted(Exception):
    """Another role failed: this one stops where it stands."""


class RoleScheduler:
    def __init__(self, seed: int, warpgroups: tuple[int, ...], ctas: tuple[int, ...] | None = None) -> None:
        self.warpgroups = warpgroups  # per role
        # per role, the rank of its CTA in the cluster (a cluster's CTAs run their roles together)
        self.ctas = ctas if ctas is not None else (0,) * len(warpgroups)
        self.seed = seed
        self.rng = random.Random(seed)
        self.cond = threading.Condition()
        self.turn: int | None = None
        self.waits: dict[int, tuple[Callable[[], bool], Callable[[], KfcError]] | None] = {}
        self.error: BaseException | None = None
        self.local = threading.local()
        self.groups: dict[int, list] = {}  # per role: its wgmma groups in flight

    # --- what the roles' ops call ------------------------------------------------------------
    def current(self) -> int:
        return self.local.role

    def current_cta(self) -> int:
        return self.ctas[self.local.role]

    def switch(self, ready: Callable[[], bool] | None = None,
               deadlock: Callable[[], KfcError] | None = None) -> None:
        """Let the scheduler pick who runs next (perhaps this role again). With `ready`, this role
        waits until it holds; `deadlock` makes the error if no role can ever run again."""
        me = self.current()
        with self.cond:
            self.waits[me] = (ready, deadlock) if ready is not None else None
            self._pass_turn()
            while self.turn != me and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _Aborted
            self.waits[me] = None

    # --- running the roles ---------------------------------------------------------------------
    def run(self, bodies: list[Callable[[], None]]) -> None:
        """Run each body as a role until all end; raise the first error any of them raised."""
        self.waits = {i: None for i in range(len(bodies))}
        # how often each role is picked when several can run: a schedule where one role runs far
        # ahead of another (a producer waiting on slow consumers, or the reverse) is where most
        # protocol faults show
        self.speed = role_speeds(self.seed, len(bodies), self.rng)
        self.groups = {i: [] for i in range(len(bodies))}
        threads = [threading.Thread(target=self._role, args=(i, body), daemon=True) for i, body in enumerate(bodies)]
        with self.cond:
            self._pass_turn()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.error is not None:
            raise self.error

    def _role(self, i: int, body: Callable[[], None]) -> None:
        self.local.role = i
        with self.cond:
            while self.turn != i and self.error is None:
                self.cond.wait()
        try:
            if self.error is None:
                body()
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - carried to the thread that runs the roles
            with self.cond:
                if self.error is None:
                    self.error = e
        finally:
            with self.cond:
                self.waits.pop(i, None)
                if self.error is None and self.waits:
                    self._pass_turn()
                self.cond.notify_all()

    def _pass_turn(self) -> None:
        """Give the turn to a role that can run (the caller holds the lock)."""
        runnable = [i for i, w in sorted(self.waits.items()) if w is None or w[0]()]
        if runnable:
            self.turn = self.rng.choices(runnable, [self.speed[i] for i in runnable])[0]
        elif self.waits:
            _, deadlock = self.waits[min(self.waits)]
            self.error = deadlock()
        self.cond.notify_all()


def run_roles(interp, warpgroups: tuple[int, ...], ctas: tuple[int, ...], bodies: list) -> None:
    """Run the bodies as roles of one schedule (role i has warpgroups[i] warpgroups and is in
    the cluster's CTA ctas[i]), a different seeded schedule each time the interpreter runs one."""
    seed = getattr(interp, "schedule_seed", 0) + getattr(interp, "schedules_run", 0)
    interp.schedules_run = getattr(interp, "schedules_run", 0) + 1
    interp.scheduler = RoleScheduler(seed, warpgroups, ctas)
    try:
        interp.scheduler.run(bodies)
    finally:
        interp.scheduler = None


def role_speeds(seed: int, roles: int, rng: random.Random) -> list[float]:
    """How much likelier each role is to be picked: seed 0 all alike, seed i <= roles role i - 1
    far ahead of the rest, later seeds at random."""
    if seed == 0:
        return [1.0] * roles
    if seed <= roles:
        return [FAST if r == seed - 1 else 1.0 for r in range(roles)]
    return [rng.choice((1 / FAST, 1.0, FAST)) for _ in range(roles)]


FAST = 20.0


def scheduler_of(machine) -> RoleScheduler | None:
    """The scheduler running the roles the current op belongs to (None outside gpu.roles)."""
    sched = getattr(machine, "scheduler", None)
    return sched if sched is not None and hasattr(sched.local, "role") else None


def yield_point(machine) -> None:
    """A protocol op is about to act: another role may run first."""
    sched = scheduler_of(machine)
    if sched is not None:
        sched.switch()
