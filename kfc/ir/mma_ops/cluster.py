"""Clusters of CTAs in a tile program: CTAs that run at once on one GPC and reach each other's
shared memory, so that one TMA load fills a stage in all of them (multicast) and a consumer
frees a stage in all of them.

    gpu.grid {grid = [GM, GN], threads = 384, group = 8, cluster = 2} (%pm, %pn) { ... }
        programs (pm, pn) with pm = 2i and 2i + 1 form one cluster: they share B's tiles
    %r = gpu.cluster_rank
        this CTA's rank in its cluster (0 .. cluster - 1)
    gpu.tma_load %tb, %sb, %full, %s, %row, %col {chunk = 1, multicast = true}
        the box lands in chunk 1 of stage s of every CTA of the cluster, and its bytes count
        against each CTA's full[s]
    gpu.mbarrier_arrive %empty, %s {cluster = true}
        the role's warps arrive on empty[s] of every CTA of the cluster

The interpreter runs a cluster's CTAs together (run_cluster): each runs the ops before its
gpu.roles, then the roles of every CTA run as coroutines of one seeded schedule, then each CTA
runs the ops after them. So a producer can run ahead of a peer's consumers, and a multicast
into a stage a peer's wgmma still reads is the hazard the interpreter reports. The generated
kernel meets at a cluster barrier before the roles (every CTA's mbarriers are initialised
before a peer's copy or arrival reaches them) and after them (no CTA exits while a peer may
still arrive on its mbarriers).
"""

from __future__ import annotations

import numpy as np

from ...diagnostics import InterpretError
from ..core import Op, define_op
from ..dtypes import DType
from ..types import TensorType
from .schedule import run_roles, scheduler_of

CLUSTER_SIZES = (1, 2, 4)  # CTAs a tile program's cluster may hold


@define_op("gpu.cluster_rank", traits={"pure"}, operands=0, results=1)
class ClusterRankOp(Op):
    def verify_(self) -> None:
        if self.result.type != TensorType(DType.INDEX):
            raise self.error(f"its result is an index, not {self.result.type}")

    def interpret(self, interp, ins, env):
        return [np.asarray(cluster_rank_of(interp), dtype=np.int64)]


def cluster_rank_of(machine) -> int:
    """The rank in its cluster of the CTA the current op runs in."""
    sched = scheduler_of(machine)
    return sched.current_cta() if sched is not None else getattr(machine, "cluster_rank", 0)


def peer_values(machine, op: Op, i: int, own) -> list:
    """Operand i of op as each CTA of the cluster holds it, in rank order ([own] outside a
    cluster): the stages, or mbarriers, at the same shared-memory offset in every CTA."""
    envs = getattr(machine, "cluster_envs", None)
    if not envs:
        return [own]
    try:
        return [env[op.operands[i]] for env in envs]
    except KeyError:
        raise InterpretError(f"{op.NAME}: operand {i} is not one the cluster's CTAs all made before their roles",
                             op.loc, "allocate stages and mbarriers at the top of the grid, before gpu.roles") from None


def roles_index(body) -> int | None:
    """The index of the gpu.roles op among the ops of a grid's body (None where it has none)."""
    return next((i for i, op in enumerate(body.ops) if op.has_trait("roles")), None)


def run_cluster(machine, grid, envs: list[dict]) -> None:
    """One cluster of grid's CTAs, CTA r on envs[r]: the ops before gpu.roles in each, the roles
    of all of them under one schedule, the ops after in each; then, per CTA, what must not be in
    flight when a program ends, and no copy left unwaited."""
    ops = grid.body.ops
    k = roles_index(grid.body)
    outer = machine.barriers
    machine.barriers, machine.cluster_envs = [], envs
    machine.cluster_store_groups = [[] for _ in envs]
    try:
        for rank, env in enumerate(envs):
            machine.cluster_rank = rank
            machine.exec_ops(ops[:k], env)
        roles = ops[k]
        bodies = [body for env in envs for body in roles.bodies(machine, env)]
        run_roles(machine, tuple(roles.warpgroups) * len(envs),
                  tuple(rank for rank in range(len(envs)) for _ in roles.regions), bodies)
        for rank, env in enumerate(envs):
            machine.cluster_rank = rank
            machine.exec_ops(ops[k + 1:], env)
        machine.check_barriers_drained()
        for stores in machine.cluster_store_groups:
            machine.store_groups = stores
            grid.program_ends(machine)
    finally:
        machine.barriers, machine.cluster_envs, machine.cluster_store_groups = outer, None, None
        machine.cluster_rank = 0


def cluster_members(grid, programs: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """The programs (program ids, or a persistent grid's CTA indices) grouped into clusters of
    grid.cluster, in rank order: along the first grid dim (CTAs next to each other in a
    persistent grid), as the launch's blockIdx.x and raster order group them."""
    c = grid.cluster
    if c == 1:
        return [[p] for p in programs]
    if grid.persistent:
        return [programs[i:i + c] for i in range(0, len(programs), c)]
    return [[(pm + r, *rest) for r in range(c)] for pm, *rest in programs if pm % c == 0]
