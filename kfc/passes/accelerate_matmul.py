"""accelerate-matmul: a whole-tensor matrix product becomes a grid of CTAs that each compute a
[bm, bn] tile of the output on tensor cores, its operands streamed through shared memory by TMA.

    %a = tile.load %A[:, :]                  gpu.grid {grid = [M/bm, N/bn]} (%pm, %pn) {
    %b = tile.load %B[:, :]                    %ta, %tb = gpu.tensor_map %A, %B
    %d = tile.dot %a, %b                       %sa, %sb = gpu.smem_stages ...   (stages copies)
    %y = epilogue(%d)             ->           %full = gpu.mbarrier_array
    tile.store %y, %C[:, :]                    prologue: stages - 1 k-tiles in flight
                                               for kt: wait full[s]; acc = gpu.wgmma acc, s;
                                                       gpu.wgmma_wait{0}; barrier; refill the
                                                       stage wgmma kt-1 read with k-tile kt+stages-1
                                               gpu.wgmma_wait{0}; %y = epilogue(acc)
                                               gpu.store_tile %y, %C[pm*bm, pn*bn] }

The epilogue (what the .kfc writes after the dot: casts, scale, a bias vector along the
columns, activations, any elementwise op on the product, scalars and such vectors) runs on the
accumulator's registers in the same kernel. A is read K-major (a [bm, 64] box per 64 columns
of K), B N-major (a [bk, 64] box per 64 columns of N), both with the 128-byte swizzle that
wgmma's descriptors name. The pipeline's depth is `stages`: k-tile kt + stages - 1 is loaded
while k-tile kt is multiplied. Elements past the tensors' bounds arrive as zeros (they add
nothing to the product) and stores are masked, so every M, N and K is exact.

TMA needs each operand's row pitch to be a multiple of 16 bytes. Where one is not (K or N odd,
say) `copy` is `threads`: every thread copies its share of the next k-tile into the other of
two stages, element by element with plain loads, while the wgmma of this one runs; a fence
makes the writes visible to wgmma and a barrier orders them before it:

    copy k-tile 0 into stage 0; fence; barrier
    for kt: acc = gpu.wgmma acc, kt % 2; copy k-tile kt+1 into stage (kt+1) % 2; fence;
            gpu.wgmma_wait{0}; barrier
"""

from __future__ import annotations


import attrs

from ..ir.builder import Builder
from ..ir.core import Block, Op, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir import layouts
from ..ir.mma_ops import CHUNK_BYTES, TMA_GRANULE, CopyStageOp, CtaBarrierOp, CtasOp, ExpectTxAtOp, FenceProxyAsyncOp
from ..ir.mma_ops import GridOp, TileCoordsOp
from ..ir.mma_ops import ClusterRankOp, MbarrierArrayOp
from ..ir.mma_ops import MbarrierArriveOp, MbarrierWaitParityOp, RolesOp, SingleThreadOp, StagesAllocOp, StoreTileOp
from ..ir.mma_ops import TmaStoreWaitOp
from ..ir.mma_ops import TensorMapOp, TmaLoadOp, arrive_count
from ..ir.mma_ops import WgmmaOp, WgmmaWaitOp, barrier_array_type
from ..ir.tile_ops import ConstOp, IndexDim
from ..ir.types import MemSpace, TensorType
from .base import Pass, PassError, define_pass, option
from .matmul_epilogue import STORE_SLOTS, epilogue, tanh_approximated, tma_store
from .matmul_match import MatmulMatch, match_matmul, tma_movable
from .matmul_tcgen05 import run_tcgen05

SMEM_RESERVE = 1024  # bytes of a CTA's shared memory left beside the dynamic (mbarriers, alignment)
CHUNK_COLUMNS = CHUNK_BYTES // 2  # a 16-bit operand's columns in one 128-byte chunk
PINGPONG_TILE = 128 * 128  # a pingpong consumer's accumulator: 128 f32 registers of each of its threads


@attrs.frozen
class Operands:
    """What accelerate-matmul resolved of a product: its tensors, sizes, who copies its tiles
    ("tma" or "threads") and why, where that is not what the options asked."""

    A: Value
    B: Value
    C: Value
    M: int
    N: int
    K: int
    copy: str
    why_copy: str
    store: str = "direct"  # how the epilogue's tile is stored: "direct" or "tma"
    approx_tanh: bool = False  # the epilogue's tanh as tanh.approx


@define_pass("accelerate-matmul",
             "a whole-tensor dot to a grid of TMA-fed, pipelined tensor-core tiles (wgmma on Hopper, tcgen05 on "
             "Blackwell)", requires={"tma", "mbarrier"})
class AccelerateMatmul(Pass):
    # the MMA: the target's (wgmma on sm_90a, tcgen05 on sm_100a), or one named
    mma: str = option("auto", choices=("auto", "wgmma", "tcgen05"))
    bm: int = option(128, choices=(64, 128))
    bn: int = option(256, choices=(64, 128, 192, 256))
    bk: int = option(64, choices=(64, 128))
    stages: int = option(4, lo=2, hi=8)  # one stage could not load k-tile kt before waiting for it
    group: int = option(8, lo=1, hi=64)
    # who brings the operands' tiles into shared memory: TMA, or every thread (any row pitch);
    # auto takes TMA where both operands' row pitches allow it
    copy: str = option("auto", choices=("auto", "tma", "threads"))
    # who issues the TMA loads: one thread of the MMA warpgroups, between their MMAs ("mma"), or
    # a producer warpgroup of its own that refills each stage as soon as the consumers free it
    # ("warpgroup": warp specialisation, gpu.roles)
    producer: str = option("mma", choices=("mma", "warpgroup"))
    # with a producer warpgroup: the wgmma groups a consumer leaves in flight while it waits for
    # the next k-tile (1 overlaps one k-tile's MMAs with the next one's issue)
    inflight: int = option(0, lo=0, hi=1)
    # with a producer warpgroup: the consumers' register budget (setmaxnreg; the producer keeps
    # 40); 0 leaves every thread what the launch gives
    registers: int = option(0, choices=(0, 232))
    # one CTA per output tile ("grid"), or one wave of CTAs each computing tiles in turn
    # ("persistent"; with a producer warpgroup, which loads the next tile's stages while the
    # consumers run this one's epilogue)
    tiles: str = option("grid", choices=("grid", "persistent"))
    # with a producer warpgroup: the consumer warpgroups share each tile, 64 rows each
    # ("cooperative"), or two consumer warpgroups take a persistent CTA's tiles in turn, each
    # holding a whole tile ("pingpong": one consumer's epilogue runs while the other multiplies;
    # the producer's order of loads staggers them). pingpong takes tiles=persistent and tiles of
    # at most 128 x 128 (a 128-row tile is two 64-row pieces of one warpgroup)
    consumers: str = option("cooperative", choices=("cooperative", "pingpong"))
    # how the epilogue's tile reaches global memory: each thread stores its registers ("direct"),
    # or the warpgroups write it into shared memory 128 bytes of columns at a time and TMA stores
    # each chunk ("tma": whole rows per store, and the threads go on while the stores drain);
    # auto takes TMA where the output's rows, the MMA (wgmma), TMA-copied operands and shared
    # memory allow it
    store: str = option("direct", choices=("direct", "tma", "auto"))
    # an epilogue's tanh as tanh.approx.f32 (one instruction, absolute error about 2^-11): auto
    # where every float output is 16-bit and checked at 1e-3 or looser (its own rounding, 2^-9
    # for bf16, is larger than the approximation's error); a bias-and-GELU GEMM at 4096^3 ran
    # 1-4% faster with it on an H100
    approx: str = option("auto", choices=("auto", "on", "off"))
    # with a producer warpgroup: CTAs of two output tiles next to each other along M run as a
    # cluster sharing B's tiles: each CTA's producer loads half of B's chunks and multicasts them
    # to both, and a stage is free once both CTAs' consumers have freed it (half B's L2 reads)
    cluster: int = option(1, choices=(1, 2))

    @property
    def warpgroups(self) -> int:
        """The warpgroups of one consumer (of the whole CTA's MMAs without a producer): a
        pingpong consumer is one warpgroup holding the whole tile."""
        return 1 if self.consumers == "pingpong" else self.bm // layouts.WGMMA_M

    @property
    def pieces(self) -> int:
        """The 64-row pieces of the tile each consumer warpgroup holds (#wgmma_acc)."""
        return self.bm // layouts.WGMMA_M // self.warpgroups

    @property
    def consumer_roles(self) -> int:
        """The consumer roles of a specialised kernel, each with its own tiles."""
        return 2 if self.consumers == "pingpong" else 1

    def options_problem(self) -> tuple[str, str] | None:
        """(what, what to do) where these options do not go together, else None: the roles'
        options need a producer warpgroup, and pingpong a persistent CTA and tiles one
        warpgroup's registers hold."""
        if self.producer == "mma" and (self.inflight or self.registers or self.tiles != "grid"
                                       or self.consumers != "cooperative"):
            return ("inflight, registers, tiles=persistent and consumers=pingpong apply to a producer warpgroup",
                    "add producer=warpgroup, or leave them out")
        if self.cluster > 1 and (self.producer == "mma" or self.group % self.cluster):
            return (f"a cluster of {self.cluster} CTAs shares B's tiles between a producer warpgroup's CTAs, "
                    f"launched {self.cluster} rows of tiles together", f"add producer=warpgroup and a group that is a "
                    f"multiple of {self.cluster}, or leave cluster at 1")
        if self.cluster > 1 and self.bn // CHUNK_COLUMNS < self.cluster:
            # a CTA loading none of B would not wait on its peer's producer, and its peer's
            # consumers could free its stages before its own producer's first wait on them
            return (f"each CTA of a cluster of {self.cluster} loads a share of B's {CHUNK_COLUMNS}-column chunks",
                    f"take bn of {CHUNK_COLUMNS * self.cluster} or more, or leave cluster at 1")
        if self.consumers == "pingpong" and self.tiles != "persistent":
            return ("consumers=pingpong gives each consumer warpgroup tiles of its own, taken in turn from a "
                    "persistent CTA's tiles", "add tiles=persistent, or leave consumers at cooperative")
        if self.consumers == "pingpong" and self.bm * self.bn > PINGPONG_TILE:
            return (f"a pingpong consumer warpgroup holds its [{self.bm}, {self.bn}] accumulator alone: at most "
                    f"{PINGPONG_TILE} elements (128 registers a thread)",
                    "take bm=128 with bn of 128 or less, or bm=64")
        return None

    def required_features(self) -> frozenset[str]:
        return self.REQUIRES | ({self.mma} if self.mma != "auto" else set())

    def spill_hint(self) -> str | None:
        # a thread of a consumer warpgroup holds bn / 2 f32 accumulators a 64-row piece
        budget = ("give the consumers 232 registers (registers=232)" if self.producer == "warpgroup"
                  and not self.registers else None)
        fits = [c for c in (192, 128, 64) if c < self.bn and attrs.evolve(self, bn=c).options_problem() is None]
        narrower = f"take a narrower tile (bn={fits[0]})" if fits else None
        return ", or ".join(x for x in (budget, narrower) if x) or None

    def instruction(self, target) -> str:
        """The MMA these options build on `target`."""
        if self.mma != "auto":
            return self.mma
        if target.has("tcgen05"):
            return "tcgen05"
        if target.has("wgmma"):
            return "wgmma"
        raise PassError(f"accelerate-matmul: {target} has neither wgmma (sm_90a) nor tcgen05 (sm_100a)",
                        hint="compile for sm_90a or sm_100a")

    def run(self, func: FuncOp, ctx) -> FuncOp:
        m = match_matmul(func)
        mma = self.instruction(ctx.target)
        approximated = tanh_approximated(self.approx, m, ctx, func)
        ops = attrs.evolve(self.operands(m, mma, ctx.target), approx_tanh=bool(approximated))
        if mma == "tcgen05":
            if self.cluster > 1:
                raise PassError("accelerate-matmul: clusters are built for wgmma's producer and consumer roles, not "
                                "the tcgen05 kernel", m.dot.loc, "leave cluster at 1 for tcgen05")
            if ops.store == "tma":
                raise PassError("accelerate-matmul: store=tma stages wgmma's fragments; the tcgen05 kernel stores "
                                "from tensor memory directly", m.dot.loc, "leave store at direct for tcgen05")
            out = run_tcgen05(self, func, ctx, m, ops)
            for op in approximated:
                ctx.approximated(self, "tanh.approx for tanh", op.loc)
            return out
        problem = self.options_problem()
        if problem:
            raise PassError(f"accelerate-matmul: {problem[0]}", m.dot.loc, problem[1])
        specialise = self.producer == "warpgroup" and ops.copy == "tma"
        if self.producer == "warpgroup" and not specialise:
            ctx.note(self, "no producer warpgroup: it issues TMA loads, and the threads copy these operands")
        if self.cluster > 1 and not specialise:
            raise PassError("accelerate-matmul: a cluster multicasts TMA loads, and the threads copy these operands"
                            f"{ops.why_copy}", m.dot.loc, "leave cluster at 1")
        self.check_smem(ops, ctx, func)
        # without roles there are no consumers to take turns: the MMA warpgroups share each tile
        build = self if specialise else attrs.evolve(self, consumers="cooperative")
        body = build._build(m, ops, specialise)
        self.note_copy(ops, ctx)
        for op in approximated:
            ctx.approximated(self, "tanh.approx for tanh", op.loc)
        return func.evolve(regions=(Block(func.args, body),))

    def operands(self, m: MatmulMatch, mma: str, target) -> "Operands":
        """The product's tensors and sizes, who copies its tiles (TMA, or the threads where TMA
        cannot: a transposed operand or a row pitch not a multiple of 16 bytes) and how its tile
        is stored: what both MMAs' kernels start from, refused here by name where neither can
        take it."""
        A, B, C = m.load_a.operands[0], m.load_b.operands[0], m.store.operands[1]
        ta, tb = A.ttype, B.ttype
        if ta.dtype is not tb.dtype or ta.dtype not in (DType.BF16, DType.F16):
            raise PassError(f"accelerate-matmul: {mma} multiplies bf16 or f16 operands of one dtype, not {ta.dtype} "
                            f"and {tb.dtype}", m.dot.loc, "cast the operands in the caller")
        if not (ta.is_static and tb.is_static):
            raise PassError("accelerate-matmul: the operands' sizes must be fixed (kfc compile --shape)", m.dot.loc)
        trans_a, trans_b = m.dot.trans_a, m.dot.trans_b
        M, K = reversed(ta.shape) if trans_a else ta.shape
        N = tb.shape[0] if trans_b else tb.shape[1]
        unaligned = [(t, name) for t, name in ((ta, A.name), (tb, B.name))
                     if t.shape[1] * t.dtype.itemsize % TMA_GRANULE]
        copy = self.copy if self.copy != "auto" else "tma" if tma_movable(m) else "threads"
        if copy == "tma" and (trans_a or trans_b):
            raise PassError("accelerate-matmul: the TMA copies take the operands as a[M, K] and b[K, N], not "
                            "transposed", m.dot.loc, "leave copy at auto: the threads then copy transposed operands")
        if copy == "tma" and unaligned:
            t, name = unaligned[0]
            raise PassError(f"accelerate-matmul: a row of {name} is {t.shape[1] * t.dtype.itemsize} bytes; TMA "
                            f"moves rows whose pitch is a multiple of {TMA_GRANULE} bytes", m.dot.loc,
                            f"leave copy at auto (the threads then copy the tiles), or pad {name}'s last dim to a "
                            f"multiple of {TMA_GRANULE // t.dtype.itemsize} elements")
        why = f" ({unaligned[0][1]} has a row pitch TMA cannot take)" if unaligned else \
            " (a transposed operand)" if copy == "threads" else ""
        store = self.store
        if store != "direct":
            tc = C.ttype
            problem = f"stores bf16, f16 or f32 outputs, not {tc.dtype}" \
                if tc.dtype not in (DType.BF16, DType.F16, DType.F32) else \
                f"takes rows whose pitch is a multiple of {TMA_GRANULE} bytes; a row of {C.name} is " \
                f"{tc.shape[1] * tc.dtype.itemsize}" if tc.shape[1] * tc.dtype.itemsize % TMA_GRANULE else None
            if problem and store == "tma":
                raise PassError(f"accelerate-matmul: a TMA store {problem}", m.store.loc,
                                "leave store at direct (or auto): each thread then stores its registers")
            if store == "auto":
                # where the threads copy the operands the kernel keeps free of tensor maps (it
                # stays packageable and takes the native launcher) and untuned, as before
                fits = self.fits_smem(copy, "tma", A.ttype.dtype.itemsize, target.smem_per_block)
                store = "tma" if mma == "wgmma" and copy == "tma" and not problem and fits else "direct"
        return Operands(A, B, C, M, N, K, copy, why, store)

    def check_smem(self, ops: "Operands", ctx, func: FuncOp) -> int:
        """The stages the kernel takes (two where the threads copy), refused where they do not
        fit the target's shared memory."""
        stages = self.stages if ops.copy == "tma" else 2
        smem = self.smem_bytes(ops.copy, "direct", ops.A.ttype.dtype.itemsize)
        staging = self.smem_bytes(ops.copy, ops.store, ops.A.ttype.dtype.itemsize) - smem
        if not self.fits_smem(ops.copy, ops.store, ops.A.ttype.dtype.itemsize, ctx.target.smem_per_block):
            slots = staging // (self.bm * CHUNK_BYTES)
            also = f" and {slots} staging slots of the output {staging}" if staging else ""
            raise PassError(f"accelerate-matmul: {stages} stages of [{self.bm}, {self.bk}] and [{self.bk}, "
                            f"{self.bn}] tiles take {smem} bytes of shared memory{also}; {ctx.target} has "
                            f"{ctx.target.smem_per_block}", func.loc, "use fewer stages or smaller tiles")
        return stages

    def smem_bytes(self, copy: str, store: str, itemsize: int) -> int:
        """The dynamic shared memory the kernel takes: its stages (two where the threads copy)
        and, with a TMA store, the output's staging slots."""
        stages = self.stages if copy == "tma" else 2
        roles = self.consumer_roles if copy == "tma" and self.producer == "warpgroup" else 1
        staging = STORE_SLOTS * roles * self.bm * CHUNK_BYTES if store == "tma" else 0
        return stages * (self.bm * self.bk + self.bk * self.bn) * itemsize + staging

    def fits_smem(self, copy: str, store: str, itemsize: int, smem_per_block: int) -> bool:
        """Whether that shared memory, and SMEM_RESERVE beside it, fits a CTA's."""
        return self.smem_bytes(copy, store, itemsize) <= smem_per_block - SMEM_RESERVE

    def note_copy(self, ops: "Operands", ctx) -> None:
        if ops.copy != self.copy:
            ctx.note(self, f"operand tiles copied by {'TMA' if ops.copy == 'tma' else 'the threads'}{ops.why_copy}")

    def copy_tiles(self, b: Builder, m: MatmulMatch, sa: Value, sb: Value, kt: Value, s: Value, row0: Value,
                   col0: Value) -> None:
        """Every thread copies its share of k-tile kt of A's and B's tiles at (row0, col0) into
        stage s, then fences the writes for the async proxy (the MMAs)."""
        A, B = m.load_a.operands[0], m.load_b.operands[0]
        k0 = b.binary("mul", kt, b.const(self.bk, DType.INDEX))
        b.create(CopyStageOp, [A, sa, s, row0, k0], [], transpose=m.dot.trans_a)
        b.create(CopyStageOp, [B, sb, s, k0, col0], [], transpose=m.dot.trans_b)
        b.create(FenceProxyAsyncOp, [], [])

    def produce(self, b: Builder, empty: Value, load, kt_count: int, row0: Value, col0: Value, base: Value) -> None:
        """The producer's k loop over one tile: k-tile kt (the CTA's it = base + kt-th) into stage
        it % stages once the consumers have freed it (empty[s]); before its first use a stage is
        free: the wait for the phase before the first returns at once."""
        S = self.stages


        with b.for_(b.as_index(0), b.as_index(kt_count), b.as_index(1), iv_name="kt") as loop:
            it = b.binary("add", base, loop.iv, name="it")
            s = b.binary("rem", it, b.as_index(S), name="s")
            uses = b.binary("div", it, b.as_index(S))
            parity = b.binary("rem", b.binary("add", uses, b.as_index(1)), b.as_index(2), name="parity")
            b.create(MbarrierWaitParityOp, [empty, s, parity], [])
            load(loop.iv, s, row0, col0)

    def _build(self, m: MatmulMatch, ops: Operands, specialise: bool) -> list[Op]:
        A, B, C, M, N, K, copy = ops.A, ops.B, ops.C, ops.M, ops.N, ops.K, ops.copy
        bm, bn = self.bm, self.bn
        acc_t = TensorType(DType.F32, (bm, bn), layout=layouts.WgmmaAccumulator(warpgroups=self.warpgroups,
                                                                               pieces=self.pieces).as_layout())
        b = Builder()
        cluster = self.cluster if specialise else 1
        grid = (-(-M // (bm * cluster)) * cluster, -(-N // bn))  # a cluster's rows of tiles: past M its loads are zeros
        persistent = self.tiles == "persistent" and specialise
        args = (Value(TensorType(DType.INDEX), "cta"),) if persistent else \
            (Value(TensorType(DType.INDEX), "pm"), Value(TensorType(DType.INDEX), "pn"))

        store = None

        def finish(acc: Value, row0: Value, col0: Value, n: Value | None = None, consumer: int = 0) -> None:
            """The epilogue on the accumulator of the consumer's n-th tile (None: its only one), stored."""
            value = epilogue(b, m, acc, acc_t, col0, ops.approx_tanh)
            if store is not None:
                store(value, row0, col0, n, consumer)
            else:
                b.create(StoreTileOp, [value, C, row0, col0], [], index=(IndexDim("slice", bm), IndexDim("slice", bn)))

        def origin(pm: Value, pn: Value) -> tuple[Value, Value]:
            return (b.binary("mul", pm, b.const(bm, DType.INDEX), name="row0"),
                    b.binary("mul", pn, b.const(bn, DType.INDEX), name="col0"))

        def each_tile(body, first: int = 0, step: int = 1) -> None:
            """body(row0, col0, n, own, more) for each output tile this CTA computes (n counting
            them) that is a role's own: the program's own tile, or the persistent CTA's tiles
            cta, cta + ctas, ... from its first-th, every step-th (own counting those); `more`
            is whether the CTA has a tile after this one (None: it has not)."""
            if not persistent:
                zero = b.const(0, DType.INDEX)
                body(*origin(*args), zero, zero, None)
                return
            ctas = b.create(CtasOp, [], [TensorType(DType.INDEX)], name="ctas").result
            start = b.binary("add", args[0], b.binary("mul", ctas, b.as_index(first))) if first else args[0]
            stride = b.binary("mul", ctas, b.as_index(step)) if step > 1 else ctas
            with b.for_(start, b.const(grid[0] * grid[1], DType.INDEX), stride, iv_name="t") as loop:
                pm, pn = b.create(TileCoordsOp, [loop.iv], [TensorType(DType.INDEX)] * 2, grid=grid,
                                  group=self.group).results
                n = b.binary("div", b.binary("sub", loop.iv, args[0]), ctas, name="n")
                own = b.binary("div", n, b.as_index(step), name="own") if step > 1 else n
                more = b.cmp("lt", b.binary("add", loop.iv, ctas), b.as_index(grid[0] * grid[1]))
                body(*origin(pm, pn), n, own, more)

        with b.at(m.dot.loc), b.region() as top:
            with b.region() as inner:
                if ops.store == "tma":
                    store = tma_store(b, C, self.bm, self.bn, self.consumer_roles if specialise else 1, self.pieces)
                if specialise:
                    self._specialised(b, A, B, K, acc_t, each_tile, finish, drain=store is not None)
                else:
                    row0, col0 = origin(*args)
                    if copy == "tma":
                        finish(self._tma_mainloop(b, A, B, K, acc_t, row0, col0), row0, col0)
                    else:
                        finish(self._threads_mainloop(b, m, A, B, K, acc_t, row0, col0), row0, col0)
                    if store is not None:
                        b.create(TmaStoreWaitOp, [], [], pending=0)
            threads = (self.warpgroups * (self.consumer_roles if specialise else 1) + specialise) * 128
            top.append(GridOp(regions=(Block(args, inner),), grid=grid, threads=threads,
                              group=self.group, persistent=persistent, cluster=cluster, loc=m.dot.loc))
        return [*m.prelude, *top]

    def staged_tiles(self, b: Builder, A: Value, B: Value, count: int) -> tuple[Value, Value]:
        """`count` stages of A's [bm, bk] and B's [bk, bn] tiles, as 128-byte chunks."""
        dt = A.ttype.dtype
        chunk = CHUNK_BYTES // dt.itemsize  # elements of a 128-byte swizzle span
        shared = layouts.SharedTile(CHUNK_BYTES).as_layout()
        sa = b.create(StagesAllocOp, [], [TensorType(dt, (count, self.bk // chunk, self.bm, chunk), MemSpace.SHARED,
                                                     shared)], name=f"s{A.name}").result
        sb = b.create(StagesAllocOp, [], [TensorType(dt, (count, self.bn // chunk, self.bk, chunk), MemSpace.SHARED,
                                                     shared)], name=f"s{B.name}").result
        return sa, sb

    def _threads_mainloop(self, b: Builder, m: MatmulMatch, A: Value, B: Value, K: int, acc_t: TensorType,
                          row0: Value, col0: Value) -> Value:
        """Two stages the threads fill: k-tile kt + 1 is copied while k-tile kt's wgmma runs."""
        kt_count = -(-K // self.bk)


        sa, sb = self.staged_tiles(b, A, B, 2)

        def copy(kt: Value, s: Value) -> None:
            self.copy_tiles(b, m, sa, sb, kt, s, row0, col0)

        copy(b.as_index(0), b.as_index(0))
        b.create(CtaBarrierOp, [], [])
        acc0 = b.create(ConstOp, [], [acc_t], value=0.0, name="acc0").result
        with b.for_(b.as_index(0), b.as_index(kt_count), b.as_index(1), carried=[acc0], iv_name="kt") as loop:
            kt = loop.iv
            acc = b.create(WgmmaOp, [loop.carried[0], sa, sb, b.binary("rem", kt, b.as_index(2), name="s")], [acc_t],
                           name="acc").result
            nxt = b.binary("add", kt, b.as_index(1), name="next")
            with b.region() as ahead:
                copy(nxt, b.binary("rem", nxt, b.as_index(2)))
            b.if_(b.cmp("lt", nxt, b.as_index(kt_count)), ahead, [], [], [], [])
            b.create(WgmmaWaitOp, [], [], pending=0)
            b.create(CtaBarrierOp, [], [])  # every thread's copy is in, and every warpgroup's wgmma done
            loop.yielded = (acc,)
        return loop.results[0]

    def tma_stages(self, b: Builder, A: Value, B: Value):
        """The tensor maps, `stages` stages and their `full` barriers; and `load(kt, s, row0,
        col0)`, which announces k-tile kt's bytes on full[s] and issues its TMA boxes of the tile
        at (row0, col0) into stage s (by the thread it runs in)."""
        bm, bn, bk, S = self.bm, self.bn, self.bk, self.stages
        dt = A.ttype.dtype
        chunk = CHUNK_BYTES // dt.itemsize
        a_box, b_box = (bm, chunk), (bk, chunk)
        stage_bytes = (bm * bk + bk * bn) * dt.itemsize
        tma_a = b.create(TensorMapOp, [A], [attrs.evolve(A.ttype, layout=layouts.TensorMapBox(
            *a_box, CHUNK_BYTES).as_layout())], box=a_box, swizzle=CHUNK_BYTES, name=f"tm_{A.name}").result
        tma_b = b.create(TensorMapOp, [B], [attrs.evolve(B.ttype, layout=layouts.TensorMapBox(
            *b_box, CHUNK_BYTES).as_layout())], box=b_box, swizzle=CHUNK_BYTES, name=f"tm_{B.name}").result
        sa, sb = self.staged_tiles(b, A, B, S)
        full = b.create(MbarrierArrayOp, [], [barrier_array_type(S)], arrivals=1, name="full").result
        rank = b.create(ClusterRankOp, [], [TensorType(DType.INDEX)], name="rank").result if self.cluster > 1 else None

        def load(kt: Value, s: Value, row0: Value, col0: Value) -> None:
            k0 = b.binary("mul", kt, b.const(bk, DType.INDEX))
            b.create(ExpectTxAtOp, [full, s], [], bytes=stage_bytes)
            for j in range(bk // chunk):
                b.create(TmaLoadOp, [tma_a, sa, full, s, row0, b.binary("add", k0, b.const(j * chunk, DType.INDEX))],
                         [], chunk=j)
            for j in range(bn // chunk):
                operands = [tma_b, sb, full, s, k0, b.binary("add", col0, b.const(j * chunk, DType.INDEX))]
                if self.cluster == 1:
                    b.create(TmaLoadOp, operands, [], chunk=j)
                    continue
                # CTA r of the cluster loads B's chunks j = r (mod cluster) into every CTA's stage
                with b.region() as mine:
                    b.create(TmaLoadOp, operands, [], chunk=j, multicast=True)
                b.if_(b.cmp("eq", rank, b.as_index(j % self.cluster)), mine, [], [], [], [])

        return sa, sb, full, load

    def _specialised(self, b: Builder, A: Value, B: Value, K: int, acc_t: TensorType, each_tile, finish,
                     drain: bool) -> None:
        """Warp specialisation: a producer warpgroup (one thread of it) loads k-tile kt into
        stage kt % stages as soon as the consumers have freed it (empty[s]), the consumer
        warpgroups wait for it (full[s]), multiply, and free each stage once its wgmma has
        retired, `inflight` groups behind; then they run the epilogue and store. The k-tiles
        are counted across the CTA's tiles (it = n * k-tiles + kt), so a persistent CTA's
        producer loads its next tile while the consumers finish this one. With two consumer
        roles (pingpong) each takes every other tile of the CTA's: the producer loads tile n's
        k-tiles before tile n + 1's, so one consumer multiplies while the other's epilogue runs."""
        S, kt_count = self.stages, -(-K // self.bk)


        sa, sb, full, load = self.tma_stages(b, A, B)
        # a stage multicast into every CTA of the cluster is free once all their consumers freed it
        empty = b.create(MbarrierArrayOp, [], [barrier_array_type(S)],
                         arrivals=arrive_count(self.warpgroups) * self.cluster, name="empty").result
        shared = self.cluster > 1

        roles = self.consumer_roles
        # pingpong: order[c] tells consumer c that the other has waited on every stage of the
        # tile before its next one. Without it a consumer, whose stage uses skip the other's,
        # could wait on a stage two phases ahead of the barrier, where the parity of the phase
        # it wants is that of one long completed, and read the stage before it is filled
        order = b.create(MbarrierArrayOp, [], [barrier_array_type(roles)], arrivals=arrive_count(self.warpgroups),
                         name="order").result if roles > 1 else None

        def produce(row0: Value, col0: Value, n: Value, own: Value, more) -> None:
            self.produce(b, empty, load, kt_count, row0, col0, b.binary("mul", n, b.as_index(kt_count), name="base"))

        def in_turn(consumer: int, own: Value) -> None:
            """Consumer `consumer` waits until the other has taken the tile before its own-th
            (the other's arrival for it is the (own + consumer - 1)-th on order[consumer])."""
            def wait() -> None:
                parity = b.binary("rem", b.binary("add", own, b.as_index(1 - consumer)), b.as_index(2), name="turn")
                b.create(MbarrierWaitParityOp, [order, b.as_index(consumer), parity], [])

            if consumer:
                wait()
                return
            with b.region() as first_waits:  # consumer 0's first tile is the CTA's first
                wait()
            b.if_(b.cmp("gt", own, b.as_index(0)), first_waits, [], [], [], [])

        def consume(row0: Value, col0: Value, n: Value, own: Value, more, consumer: int) -> None:
            if order is not None:
                in_turn(consumer, own)
            base = b.binary("mul", n, b.as_index(kt_count), name="base")
            acc0 = b.create(ConstOp, [], [acc_t], value=0.0, name="acc0").result
            with b.for_(b.as_index(0), b.as_index(kt_count), b.as_index(1), carried=[acc0], iv_name="kt") as loop:
                kt = loop.iv
                it = b.binary("add", base, kt, name="it")
                s = b.binary("rem", it, b.as_index(S), name="s")
                parity = b.binary("rem", b.binary("div", it, b.as_index(S)), b.as_index(2), name="parity")
                b.create(MbarrierWaitParityOp, [full, s, parity], [])
                acc = b.create(WgmmaOp, [loop.carried[0], sa, sb, s], [acc_t], name="acc").result
                b.create(WgmmaWaitOp, [], [], pending=self.inflight)
                if self.inflight:
                    with b.region() as free:  # k-tile kt - 1's wgmma has retired: its stage is free
                        b.create(MbarrierArriveOp, [empty, b.binary("rem", b.binary("add", it, b.as_index(S - 1)),
                                                                    b.as_index(S))], [], cluster=shared)
                    b.if_(b.cmp("gt", kt, b.as_index(0)), free, [], [], [], [])
                else:
                    b.create(MbarrierArriveOp, [empty, s], [], cluster=shared)
                loop.yielded = (acc,)
            b.create(WgmmaWaitOp, [], [], pending=0)
            if self.inflight:
                last = b.binary("rem", b.binary("add", base, b.as_index(kt_count - 1)), b.as_index(S))
                b.create(MbarrierArriveOp, [empty, last], [], cluster=shared)
            if order is not None:  # the other consumer's turn, where the CTA has a tile for it
                with b.region() as hand_over:
                    b.create(MbarrierArriveOp, [order, b.as_index(1 - consumer)], [])
                b.if_(more, hand_over, [], [], [], [])
            finish(loop.results[0], row0, col0, own, consumer)

        with b.region() as producer:
            with b.region() as one_thread:
                each_tile(produce)
            b.create(SingleThreadOp, [], [], regions=[Block((), one_thread)])
        consumers = []
        for c in range(roles):
            with b.region() as role:
                each_tile(lambda *at, c=c: consume(*at, c), first=c, step=roles)
                if drain:  # every store has read its slot before the CTA's shared memory goes
                    b.create(TmaStoreWaitOp, [], [], pending=0)
            consumers.append(Block((), role))
        registers = (40,) + (self.registers,) * roles if self.registers else ()
        b.create(RolesOp, [], [], regions=[Block((), producer), *consumers],
                 warpgroups=(1,) + (self.warpgroups,) * roles, registers=registers)

    def _tma_mainloop(self, b: Builder, A: Value, B: Value, K: int, acc_t: TensorType, row0: Value,
                      col0: Value) -> Value:
        """`stages` stages TMA fills, one thread issuing: k-tile kt + stages - 1 is in flight
        while k-tile kt's wgmma runs."""
        S = self.stages
        kt_count = -(-K // self.bk)


        sa, sb, full, load = self.tma_stages(b, A, B)

        def issue(kt: Value, s: Value) -> None:
            """k-tile kt into stage s, by one thread: one announcement, then its boxes."""
            with b.region() as ops:
                load(kt, s, row0, col0)
            b.create(SingleThreadOp, [], [], regions=[Block((), ops)])

        with b.for_(b.as_index(0), b.as_index(min(S - 1, kt_count)), b.as_index(1), iv_name="p") as pro:
            issue(pro.iv, pro.iv)
        acc0 = b.create(ConstOp, [], [acc_t], value=0.0, name="acc0").result
        with b.for_(b.as_index(0), b.as_index(kt_count), b.as_index(1), carried=[acc0], iv_name="kt") as loop:
            kt = loop.iv
            s = b.binary("rem", kt, b.as_index(S), name="s")
            parity = b.binary("rem", b.binary("div", kt, b.as_index(S)), b.as_index(2), name="parity")
            b.create(MbarrierWaitParityOp, [full, s, parity], [])
            acc = b.create(WgmmaOp, [loop.carried[0], sa, sb, s], [acc_t], name="acc").result
            # k-tile kt's wgmma is done in every warpgroup: its stage may be refilled. Leaving
            # one group in flight here (wgmma_wait{1}) lost the last k-tile's product on the
            # H200 at some stage counts (a race not yet understood): every group is retired
            b.create(WgmmaWaitOp, [], [], pending=0)
            b.create(CtaBarrierOp, [], [])
            nxt = b.binary("add", kt, b.as_index(S - 1), name="next")
            fits = b.cmp("lt", nxt, b.as_index(kt_count))
            with b.region() as refill:
                issue(nxt, b.binary("rem", nxt, b.as_index(S)))
            b.if_(fits, refill, [], [], [], [])
            loop.yielded = (acc,)
        b.create(WgmmaWaitOp, [], [], pending=0)
        return loop.results[0]
