"""The `gpu` dialect's tile programs on tensor cores: a grid of program ids, TMA tensor maps,
staged shared-memory tiles, arrays of mbarriers, warpgroup MMAs (wgmma) and their waits.

    gpu.grid {grid = [GM, GN], threads = 256, group = 8} (%pm, %pn) { ... }
        one CTA per program id (pm, pn) of a GM x GN grid; `group` rows of programs are
        launched together (raster order: programs that share operand tiles run close in time)
    gpu.grid {grid = [GM, GN], threads = 384, group = 8, persistent = true} (%cta) { ... }
        one wave of CTAs, each looping over the grid's tiles itself:
    %n = gpu.ctas
        the CTAs a persistent grid runs on (gridDim.x)
    %pm, %pn = gpu.tile_coords %t {grid = [GM, GN], group = 8}
        tile t's row and column of tiles, in the grid's raster order
    %ta = gpu.tensor_map %a {box = [128, 64], swizzle = 128}
        a's TMA descriptor: boxes of [128, 64] elements, landing swizzled in shared memory
    %sa = gpu.smem_stages : bf16[4, 1, 128, 64] @shared #shared<swizzle = 128>
        `stages` copies of a tile held as chunks of [rows, 64]: stage s, chunk j
    %bars = gpu.mbarrier_array {arrivals = 1} : i64[4] @shared
        one mbarrier per stage
    gpu.single_thread { ... }
        what one thread of the CTA does: announcing a stage's bytes and issuing its TMA loads
    gpu.expect_tx_at %bars, %s {bytes = 49152}
        one arrival on bars[s] that announces the bytes its copies will bring
    gpu.tma_load %ta, %sa, %bars, %s, %row, %col {chunk = 0}
        the box of a at (row, col) into chunk 0 of stage s; elements past a's bounds land as
        zeros; the box's bytes count against bars[s]'s announced ones
    gpu.copy_stage %a, %sa, %s, %row, %col {transpose = false}
        every thread copies its share of the tile at (row, col) of a into stage s (all its
        chunks), zeros past a's bounds, with plain loads and stores: for tensors TMA cannot
        take (a row pitch that is not a multiple of 16 bytes) and transposed operands
    gpu.fence_proxy_async
        the threads' writes to shared memory become visible to wgmma (the async proxy)
    gpu.mbarrier_wait_parity %bars, %s, %parity
        wait for the phase of bars[s] with this parity to complete; its copies become visible
    %acc1 = gpu.wgmma %acc, %sa, %sb, %s
        acc + A·B in f32 (A = stage s of sa, its chunks side by side along K; B = stage s of sb,
        its chunks side by side along N), issued asynchronously: stage s stays being read
        until a gpu.wgmma_wait retires it
    gpu.wgmma_wait {pending = 1}
        every warpgroup waits until at most `pending` of its wgmma groups are in flight, then
        the CTA meets at a barrier (so no thread refills a stage another warpgroup still reads)
    %bias_t = gpu.load_columns %bias, %k
        a vector spread down the rows of a fragment tile: (r, c) holds bias[k + c]
    gpu.store_tile %v, %c, %r, %k {index = [+128, +256]}
        tile.store of a register tile held in a fragment layout (#wgmma_acc)
    gpu.stage_fragment %v, %out, %slot {column = 64}
        every thread writes its registers of columns 64.. of a #wgmma_acc tile into a staging slot
    gpu.tma_store %tc, %out, %slot, %r, %k
        each warpgroup stores its 64 rows of the slot to global memory by TMA (one bulk group)
    gpu.tma_store_wait {pending = 1}
        until at most `pending` stores still read their slots (kfc.ir.mma_ops.tma_store)

    gpu.roles {warpgroups = [1, 2], registers = [40, 232]} { producer } { consumers }
        warp specialisation: region i runs on the next warpgroups[i] warpgroups, all at once
    gpu.mbarrier_arrive %bars, %s
        every warp of the role arrives on bars[s] (a consumer frees a stage for the producer)
    %r = gpu.cluster_rank, gpu.tma_load {multicast = true}, gpu.mbarrier_arrive {cluster = true}
        a cluster's CTAs sharing stages (kfc.ir.mma_ops.cluster)
    %acc = gpu.tmem_alloc, gpu.tcgen05_mma, gpu.tcgen05_commit, gpu.tmem_load, gpu.tmem_dealloc
        Blackwell's MMA: the accumulator in tensor memory (kfc.ir.mma_ops.tcgen05)

The interpreter runs wgmma at once and keeps which stages each group still reads: a TMA load
into a stage an unretired wgmma reads, a wgmma reading a stage whose copy nobody waited for,
a wait with the wrong parity (it would return before the copies land), and a wgmma reading a
stage the threads wrote before a gpu.fence_proxy_async are hazards at the op that commits them.
"""

from .grid import (CHUNK_BYTES, GRID_THREADS, TMA_BOX_LIMIT, TMA_GRANULE, CtaBarrierOp, CtasOp, GridOp, SingleThreadOp,
                   TileCoordsOp, raster,
                   StagedCopy, StagedTile, barrier_array_type, is_barrier_array, is_staged_tile)
from .tma import (CopyStageOp, ExpectTxAtOp, FenceProxyAsyncOp, MbarrierArrayOp, MbarrierWaitParityOp, StagesAllocOp,
                  TensorMapOp, TmaLoadOp)
from .tcgen05 import (TMEM_LOAD_COLUMNS, Tcgen05CommitOp, Tcgen05MmaOp, TensorMemoryTile, TmemAllocOp, TmemDeallocOp,
                      TmemLoadOp)
from .cluster import CLUSTER_SIZES, ClusterRankOp
from .roles import REGISTER_BUDGETS, MbarrierArriveOp, RolesOp, arrive_count
from .tma_store import STORE_ROWS, StageFragmentOp, TmaStoreOp, TmaStoreWaitOp
from .wgmma import LoadColumnsOp, StoreTileOp, WgmmaOp, WgmmaWaitOp, wgmma_operands
