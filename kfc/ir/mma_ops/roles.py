"""Warp specialisation: the CTA's warpgroups split into roles that run different code at once
(gpu.roles), and the arrival by which one role tells another a stage is free again
(gpu.mbarrier_arrive).

    gpu.roles {warpgroups = [1, 2], registers = [40, 232]} { producer } { consumers }
        region i runs on the next warpgroups[i] warpgroups of the CTA (the first region on
        warpgroup 0); inside it, thread and warpgroup numbers count from its first warpgroup.
        With `registers`, each role first sets its threads' register budget (setmaxnreg): the
        producer gives registers back, the consumers take them.
    gpu.mbarrier_arrive %bars, %s {cluster = false}
        every warp of the role (or of the CTA, outside gpu.roles) arrives once on bars[s]: an
        array made with `arrivals` = 4 x its warpgroups completes a phase when all have. With
        `cluster`, on bars[s] of every CTA of the cluster (a stage a multicast load fills in
        every CTA is free only once every CTA's consumers have freed it)

The roles talk only through mbarriers and the stages they guard; a gpu.cta_barrier inside a
role would wait for threads that never reach it. The interpreter runs the roles as coroutines
(kfc.ir.mma_ops.schedule) under a seeded schedule, and the barrier check under several.
"""

from __future__ import annotations

import attrs

from ..core import Op, define_op, walk_block
from ..tile_ops.checks import check_int_scalar
from .grid import WARPS_PER_WARPGROUP, CtaBarrierOp, is_barrier_array, stage_index, wgmma_groups_of
from .cluster import peer_values
from .schedule import run_roles, scheduler_of, yield_point

# setmaxnreg's range: multiples of 8 from 24 to 256 registers a thread
REGISTER_BUDGETS = range(24, 257, 8)
REGISTER_FILE = 65536  # 32-bit registers of an SM, all the CTA's threads' budgets together


@define_op("gpu.roles", traits={"writes_memory", "roles"}, operands=0, results=0)
class RolesOp(Op):
    warpgroups: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    # () leaves every thread the budget the kernel was built with
    registers: tuple[int, ...] = attrs.field(default=(), converter=tuple)

    @property
    def threads(self) -> int:
        return 128 * sum(self.warpgroups)

    def first_warpgroup(self, role: int) -> int:
        return sum(self.warpgroups[:role])

    def verify_(self) -> None:
        if len(self.regions) < 2 or len(self.regions) != len(self.warpgroups):
            raise self.error(f"needs a region for each role (two or more) and as many warpgroup counts, not "
                             f"{len(self.regions)} regions and warpgroups = {list(self.warpgroups)}")
        if any(not isinstance(w, int) or w < 1 for w in self.warpgroups):
            raise self.error(f"each role has one or more warpgroups, not {list(self.warpgroups)}")
        if self.registers:
            if len(self.registers) != len(self.warpgroups) or any(r not in REGISTER_BUDGETS for r in self.registers):
                raise self.error(f"registers gives each role a budget, a multiple of 8 from 24 to 256, not "
                                 f"{list(self.registers)}")
            used = sum(128 * w * r for w, r in zip(self.warpgroups, self.registers))
            if used > REGISTER_FILE:
                raise self.error(f"the roles' register budgets take {used} registers; an SM has {REGISTER_FILE}",
                                 "give the producer fewer (it only issues copies) or the consumers fewer")
        for region in self.regions:
            if region.args:
                raise self.error("a role's region takes no arguments")
            for op in walk_block(region):
                if isinstance(op, CtaBarrierOp):
                    raise op.error("a CTA barrier inside a role waits for threads of other roles that never "
                                   "reach it", "let the roles meet through mbarriers (gpu.mbarrier_arrive, "
                                   "gpu.mbarrier_wait_parity)")
                if isinstance(op, RolesOp):
                    raise op.error("roles do not nest")

    def interpret(self, interp, ins, env):
        """Each role a coroutine on a copy of the environment (values defined in a role stay in
        it); a different seeded schedule each time the interpreter runs the roles."""
        run_roles(interp, self.warpgroups, (0,) * len(self.regions), self.bodies(interp, env))
        return None

    def bodies(self, interp, env: dict) -> list:
        """What each role runs: its region on a copy of env, ending with no wgmma in flight."""
        def role(region):
            def body():
                interp.exec_block(region, dict(env))
                if wgmma_groups_of(interp):
                    raise self.error(f"a role ends with {len(wgmma_groups_of(interp))} wgmma group(s) in flight",
                                     "end the role's MMAs with gpu.wgmma_wait {pending = 0}")
            return body

        return [role(r) for r in self.regions]


@define_op("gpu.mbarrier_arrive", traits={"writes_memory"}, operands=2, results=0)
class MbarrierArriveOp(Op):
    # arrive on bars[s] of every CTA of the cluster (kfc.ir.mma_ops.cluster), not this CTA's alone
    cluster: bool = False

    def verify_(self) -> None:
        if not is_barrier_array(self.operands[0].type):
            raise self.error(f"arrives on an array of mbarriers (i64[stages] @shared), not {self.operands[0].type}")
        check_int_scalar(self, self.operands[1], "stage")

    def advance(self, machine, ins) -> None:
        """Every warp of the role arrives; a phase that needs no bytes ends with its last arrival."""
        yield_point(machine)
        s = stage_index(self, ins[1], len(ins[0]))
        sched = scheduler_of(machine)
        warpgroups = sched.warpgroups[sched.current()] if sched is not None else machine.cta_warpgroups
        for bars in peer_values(machine, self, 0, ins[0]) if self.cluster else [ins[0]]:
            bar = bars[s]
            for _ in range(arrive_count(warpgroups)):
                bar.arrive(self)
            if not bar.copies and bar.blocker(self) is None:
                bar.complete(self)

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


def arrive_count(warpgroups: int) -> int:
    """The arrivals of an mbarrier that every warp of `warpgroups` warpgroups arrives on."""
    return WARPS_PER_WARPGROUP * warpgroups

