"""The grid of CTAs that tensor-core programs run in (gpu.grid, gpu.cta_barrier,
gpu.single_thread), the types and sizes of staged tiles and mbarrier arrays, and the machine
model the protocol ops of kfc.ir.mma_ops.tma and kfc.ir.mma_ops.wgmma move."""

from __future__ import annotations

import attrs
import numpy as np

from ...diagnostics import InterpretError
from ..core import Op, define_op, walk_block
from ..dtypes import DType
from ..gpu_ops import check_layouts
from ..smem_ops import HINT_WAIT_BEFORE_READ, HazardError
from ..types import MemSpace, TensorType
from .cluster import CLUSTER_SIZES, ClusterRankOp, cluster_members, cluster_rank_of, roles_index, run_cluster
from .schedule import scheduler_of, yield_point

TMA_BOX_LIMIT = 256     # elements along each dim of a TMA box
TMA_GRANULE = 16        # bytes: a tensor map's row pitch and base are multiples of it
CHUNK_BYTES = 128       # a staged chunk's row: one 128-byte swizzle span
GRID_THREADS = (128, 256, 384)
WARPS_PER_WARPGROUP = 4


def barrier_array_type(stages: int) -> TensorType:
    return TensorType(DType.I64, (stages,), MemSpace.SHARED)


def is_barrier_array(t) -> bool:
    return isinstance(t, TensorType) and t.dtype is DType.I64 and t.space is MemSpace.SHARED and t.rank == 1 \
        and t.layout is None


def is_staged_tile(t) -> bool:
    return isinstance(t, TensorType) and t.space is MemSpace.SHARED and t.rank == 4 and t.layout is not None \
        and t.layout.kind == "shared"


# --- the machine model the interpreter runs ------------------------------------------------------


@attrs.define(eq=False)
class StagedTile:
    """A staged shared-memory tile: data [stages, chunks, rows, cols] (None when only the protocol
    is followed, kfc.ir.grid_protocol), and per (stage, chunk) the barrier whose phase will
    deliver a copy in flight."""

    name: str
    data: np.ndarray | None
    pending: dict = attrs.Factory(dict)  # (stage, chunk) -> MBarrier

    def stage_ready(self, op: Op, s: int) -> None:
        for (stage, _), bar in self.pending.items():
            if stage == s:
                raise HazardError(f"{op.NAME}: reads stage {s} of {self.name} while the copy into it is in flight "
                                  f"(nobody waited on {bar.name})", op.loc, HINT_WAIT_BEFORE_READ)

    def refill(self, op: Op, machine, s: int) -> None:
        """A copy into stage s begins: no wgmma in flight may still read it."""
        for group in every_mma_group(machine):
            if (id(self), s) in group:
                mma = "tcgen05.mma" if TCGEN05 in group else "wgmma"
                raise HazardError(f"{op.NAME}: overwrites stage {s} of {self.name} while a {mma} reading it is in "
                                  "flight", op.loc, "retire the wgmma with gpu.wgmma_wait before refilling its stage"
                                  if mma == "wgmma" else "wait on the barrier its tcgen05.commit arrives on first")


@attrs.frozen
class StagedCopy:
    """A copy into one chunk of one stage, landing when its barrier's phase completes."""

    tile: StagedTile
    stage: int
    chunk: int

    @property
    def name(self) -> str:
        return f"stage {self.stage} of {self.tile.name}"


# The protocol's state lives on the machine that runs it: the interpreter, or the static walk of
# kfc.ir.grid_protocol. Each protocol op's `advance` moves it; its `interpret` adds the data.
def unfenced_of(machine) -> set:
    """The (staged tile, stage) pairs the threads wrote that no gpu.fence_proxy_async has yet
    made visible to the async proxy."""
    if not hasattr(machine, "unfenced"):
        machine.unfenced = set()
    return machine.unfenced


def wgmma_groups_of(machine) -> list:
    """The wgmma groups the current role (or the CTA, outside gpu.roles) has in flight: each a
    set of (staged tile, stage) it reads."""
    sched = scheduler_of(machine)
    if sched is not None:
        return sched.groups[sched.current()]
    if not hasattr(machine, "wgmma_groups"):
        machine.wgmma_groups = []
    return machine.wgmma_groups


def every_mma_group(machine) -> list:
    """The asynchronous MMA groups in flight in any role, wgmma's and tcgen05's: a copy into a
    stage must wait for all of them."""
    sched = getattr(machine, "scheduler", None)
    roles = [g for groups in sched.groups.values() for g in groups] if sched is not None else []
    return [*getattr(machine, "wgmma_groups", []), *roles, *tcgen05_groups_of(machine)]


@attrs.frozen
class StoreGroup:
    """A TMA store in flight: it reads `slot` of the staging tile until a wait retires it."""

    tile: object
    slot: int


def store_groups_of(machine) -> list:
    """The TMA stores the current CTA issued and not yet retired by a gpu.tma_store_wait,
    oldest first."""
    by_cta = getattr(machine, "cluster_store_groups", None)
    if by_cta is not None:
        return by_cta[cluster_rank_of(machine)]
    if not hasattr(machine, "store_groups"):
        machine.store_groups = []
    return machine.store_groups


class GroupWait:
    """What gpu.wgmma_wait and gpu.tma_store_wait share: wait until at most `pending` of the
    asynchronous groups `groups_of(machine)` lists are in flight (the oldest retire first)."""

    GROUPS = "groups"  # what a message calls them

    def groups_of(self, machine) -> list:
        raise NotImplementedError

    def verify_(self) -> None:
        if not 0 <= self.pending <= 7:
            raise self.error(f"pending is 0..7 {self.GROUPS}, not {self.pending}")

    def advance(self, machine, ins) -> None:
        yield_point(machine)
        groups = self.groups_of(machine)
        del groups[:max(0, len(groups) - self.pending)]

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


TCGEN05 = "tcgen05"  # the mark of a tcgen05.mma group among the (tile, stage) pairs it reads


def tcgen05_groups_of(machine) -> list:
    """The tcgen05.mma groups issued and not yet known done (a group's set is emptied when the
    barrier phase a tcgen05.commit made wait for it completes)."""
    if not hasattr(machine, "tcgen05_groups"):
        machine.tcgen05_groups = []
    machine.tcgen05_groups[:] = [g for g in machine.tcgen05_groups if g]
    return machine.tcgen05_groups


def stage_index(op: Op, value, stages: int) -> int:
    s = int(np.asarray(value))
    if not 0 <= s < stages:
        raise InterpretError(f"{op.NAME}: stage {s} is out of range for {stages} stages", op.loc)
    return s


# --- the grid -------------------------------------------------------------------------------------


# the CTAs the interpreter runs a persistent grid on: fewer than its tiles, so that a CTA takes
# several in turn, as on the GPU, where one wave of CTAs runs however many tiles there are
def persistent_ctas(tiles: int, cluster: int = 1) -> int:
    return -(-max(1, -(-tiles // 3)) // cluster) * cluster


@define_op("gpu.grid", traits={"loop"}, operands=0, results=0)
class GridOp(Op):
    """Independent programs over an N-D grid of program ids (the region's index arguments), one
    CTA of `threads` threads each. A `persistent` grid launches one wave of CTAs instead, its
    region's one argument the CTA's index; the CTAs loop over the grid's tiles themselves
    (gpu.ctas, gpu.tile_coords). With `cluster` > 1 the programs form clusters of that many
    along the first grid dim (kfc.ir.mma_ops.cluster), run together by the interpreter."""

    grid: tuple[int, ...] = attrs.field(converter=tuple)
    threads: int = 128
    group: int = 1  # raster order: program rows launched together along the first grid dim
    persistent: bool = False
    cluster: int = 1

    @property
    def tiles(self) -> int:
        return int(np.prod(self.grid))

    @property
    def body(self):
        return self.regions[0]

    def verify_(self) -> None:
        args = 1 if self.persistent else len(self.grid)
        if len(self.regions) != 1 or len(self.body.args) != args:
            raise self.error("a persistent grid's region takes one argument, the CTA's index" if self.persistent else
                             f"needs one region with an index argument per grid dim ({len(self.grid)})")
        if not 1 <= len(self.grid) <= 3 or any(not isinstance(g, int) or g < 1 for g in self.grid):
            raise self.error(f"the grid has 1 to 3 dims of at least one program, not {list(self.grid)}")
        if any(a.type != TensorType(DType.INDEX) for a in self.body.args):
            raise self.error("program ids are index scalars")
        if self.threads not in GRID_THREADS:
            raise self.error(f"threads must be whole warpgroups ({', '.join(map(str, GRID_THREADS))}), "
                             f"not {self.threads}")
        if self.group < 1:
            raise self.error(f"group must be positive, not {self.group}")
        for op in self.body.ops:
            if op.has_trait("roles") and op.threads != self.threads:  # gpu.roles (kfc.ir.mma_ops.roles)
                raise op.error(f"its roles take {op.threads} threads; the grid's CTA has {self.threads}",
                               "give the grid 128 threads for each warpgroup of every role")
        check_layouts(self.body, self.threads, 1, 1)
        self.verify_cluster()

    def verify_cluster(self) -> None:
        """A cluster is whole programs along the first grid dim, which the raster order keeps
        together, and CTAs specialised into roles (run together by the interpreter); ops that
        reach other CTAs need one."""
        if self.cluster not in CLUSTER_SIZES:
            raise self.error(f"cluster is one of {CLUSTER_SIZES} CTAs, not {self.cluster}")
        if self.cluster == 1:
            for op in walk_block(self.body):
                if getattr(op, "multicast", False) or getattr(op, "cluster", False) or isinstance(op, ClusterRankOp):
                    raise op.error("reaches the other CTAs of a cluster, and this grid's CTAs form none",
                                   "give the gpu.grid a cluster of 2 or 4")
            return
        if len(self.grid) != 2 or self.grid[0] % self.cluster or self.group % self.cluster:
            raise self.error(f"a cluster of {self.cluster} takes a 2-D grid whose first dim and group are multiples "
                             f"of it, not grid = {list(self.grid)}, group = {self.group}")
        if roles_index(self.body) is None:
            raise self.error("a cluster's CTAs are warp-specialised: its body holds a gpu.roles")

    def interpret(self, interp, ins, env):
        interp.cta_warpgroups = self.threads // 128
        interp.ctas = persistent_ctas(self.tiles, self.cluster)
        programs = list(np.ndindex(interp.ctas) if self.persistent else np.ndindex(*self.grid))
        for members in cluster_members(self, programs):
            envs = [env] if self.cluster == 1 else [dict(env) for _ in members]
            for e, pid in zip(envs, members):
                for arg, i in zip(self.body.args, pid):
                    e[arg] = np.asarray(i, dtype=np.int64)
            interp.wgmma_groups, interp.tcgen05_groups, interp.store_groups = [], [], []
            self.run_programs(interp, envs)
        return None

    def run_programs(self, machine, envs: list[dict]) -> None:
        """One program (envs[0]), or one cluster's CTAs together (CTA r on envs[r]), on `machine`:
        the interpreter, or the barrier check's walk; then what must not be in flight at the end."""
        if self.cluster > 1:
            run_cluster(machine, self, envs)
            return
        machine.exec_iteration(self.body, envs[0])
        self.program_ends(machine)

    def program_ends(self, machine) -> None:
        if wgmma_groups_of(machine):
            raise HazardError(f"{self.NAME}: a program ends with {len(machine.wgmma_groups)} wgmma group(s) in "
                              "flight", self.loc, "end the program's MMAs with gpu.wgmma_wait {pending = 0}")
        if tcgen05_groups_of(machine):
            raise HazardError(f"{self.NAME}: a program ends with {len(machine.tcgen05_groups)} tcgen05.mma group(s) "
                              "nobody waited for", self.loc, "commit them to an mbarrier and wait on it")
        if store_groups_of(machine):
            raise HazardError(f"{self.NAME}: a program ends with {len(machine.store_groups)} TMA store(s) still "
                              "reading shared memory", self.loc, "end the program's stores with gpu.tma_store_wait "
                              "{pending = 0}")


@define_op("gpu.ctas", traits={"pure"}, operands=0, results=1)
class CtasOp(Op):
    """The CTAs a persistent grid runs on (the GPU's one wave: gridDim.x)."""

    def verify_(self) -> None:
        if self.result.type != TensorType(DType.INDEX):
            raise self.error(f"its result is an index, not {self.result.type}")

    def interpret(self, interp, ins, env):
        return [np.asarray(interp.ctas, dtype=np.int64)]


@define_op("gpu.tile_coords", traits={"pure"}, operands=1, results=2)
class TileCoordsOp(Op):
    """Tile t of a [GM, GN] grid as its (row, column) of tiles, in the raster order of gpu.grid:
    rows of tiles in groups of `group`, column by column within a group."""

    grid: tuple[int, ...] = attrs.field(converter=tuple)
    group: int = 1

    def verify_(self) -> None:
        if len(self.grid) != 2 or any(g < 1 for g in self.grid) or self.group < 1:
            raise self.error(f"decodes a 2-D grid of tiles with a positive group, not grid = {list(self.grid)}, "
                             f"group = {self.group}")
        if any(v.type != TensorType(DType.INDEX) for v in (*self.operands, *self.results)):
            raise self.error("takes and gives index scalars")

    def interpret(self, interp, ins, env):
        return [np.asarray(v, dtype=np.int64) for v in raster(int(ins[0]), *self.grid, self.group)]


def raster(t: int, gm: int, gn: int, group: int) -> tuple[int, int]:
    """(pm, pn) of program t: what the generated code computes from blockIdx.x."""
    per_group = group * gn
    first = t // per_group * group
    rows = min(gm - first, group)
    return first + (t % per_group) % rows, (t % per_group) // rows


@define_op("gpu.cta_barrier", traits={"writes_memory"}, operands=0, results=0)
class CtaBarrierOp(Op):
    """Every thread of the CTA meets here (bar.sync): orders what warpgroups did to shared memory
    before it against what any thread does after."""

    def advance(self, machine, ins) -> None:
        pass  # one thread of control runs the protocol: nothing to order

    def interpret(self, interp, ins, env):
        return None


@define_op("gpu.single_thread", traits={"writes_memory"}, operands=0, results=0)
class SingleThreadOp(Op):
    """Its region runs in one thread of the CTA (thread 0): who announces a stage's bytes and
    issues its TMA loads. The interpreter runs it once per program, as that thread does."""

    @property
    def body(self):
        return self.regions[0]

    def verify_(self) -> None:
        if len(self.regions) != 1 or self.body.args:
            raise self.error("needs one region without arguments")

    def interpret(self, interp, ins, env):
        interp.exec_block(self.body, env)
        return None
