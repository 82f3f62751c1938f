"""Clusters of CTAs sharing B's tiles (accelerate-matmul{cluster=2}): the product in the
interpreter, which runs a cluster's CTAs together with their roles under one schedule; planted
faults of the shared stages found by the barrier check; the options it needs refused by name;
the kernel built for sm_90a with its multicast TMA loads and cluster barriers."""

from __future__ import annotations

import numpy as np
import pytest

from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.diagnostics import KfcError, VerifyError
from kfc.frontend import load_kfc
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.core import Block
from kfc.ir.interpreter import run
from kfc.ir.mma_ops import GridOp, MbarrierArrayOp, MbarrierArriveOp, TmaLoadOp
from kfc.model.target import parse_target
from test_matmul import lowered, operands

CLUSTER = "accelerate-matmul{producer=warpgroup,cluster=2"


@pytest.mark.parametrize("m,n,k,pipe", [
    (1, 8, 8, CLUSTER + "}"),  # one tile of rows: the cluster's second CTA computes rows past M
    (130, 264, 200, CLUSTER + "}"),
    (300, 600, 200, CLUSTER + ",inflight=1,stages=3}"),  # 3 rows of tiles rounded up to 4
    (100, 72, 136, CLUSTER + ",inflight=1,bm=64,bn=128,stages=2}"),  # a chunk of B each
    (300, 600, 200, CLUSTER + ",inflight=1,tiles=persistent,stages=3}"),
    (300, 600, 200, CLUSTER + ",inflight=1,registers=232,bm=128,bn=128,tiles=persistent,consumers=pingpong,"
                              "stages=3}"),
    (200, 328, 320, CLUSTER + ",bm=64,bn=192,stages=2,store=tma}"),
])
def test_a_cluster_computes_the_product(m, n, k, pipe):
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k}, f"canonicalize,{pipe},cse,dce")
    [grid] = [op for op in low.walk() if isinstance(op, GridOp)]
    assert grid.cluster == 2 and grid.grid[0] % 2 == 0
    assert any(isinstance(op, TmaLoadOp) and op.multicast for op in low.walk())
    args = operands(m, n, k)
    want = run(func, args)["c"].astype(np.float32)
    got = run(low, args)["c"].astype(np.float32)
    assert not np.isnan(got).any(), "an output element was never stored"
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)


def test_the_clustered_ir_prints_and_parses_back():
    _, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 256, "N": 256, "K": 256}, f"canonicalize,{CLUSTER}}}")
    text = print_ir(low)
    assert "cluster = 2" in text and "multicast = true" in text and "gpu.cluster_rank" in text
    assert print_ir(verify(parse_ir(text))) == text


def _planted(func, fix):
    def block(b):
        return Block(b.args, [fix(op).evolve(regions=tuple(block(r) for r in op.regions)) if op.regions else fix(op)
                              for op in b.ops])
    return func.evolve(regions=(block(func.body),))


def _clustered(k=1024):
    return lowered(load_kfc("kernels/gemm.kfc"), {"M": 256, "N": 256, "K": k}, f"canonicalize,{CLUSTER}}}")[1]


def _local_arrivals(op):
    return op.evolve(cluster=False) if isinstance(op, MbarrierArriveOp) and op.cluster else op


def test_consumers_freeing_only_their_own_ctas_stage_deadlock_the_peers_producer():
    with pytest.raises(VerifyError, match="deadlock: waits on %empty.*16 arrival"):
        verify(_planted(_clustered(), _local_arrivals))


def test_a_producer_refilling_a_stage_the_peer_still_reads_is_found():
    """Consumers free only their CTA's stage and empty counts one CTA's arrivals: a producer then
    multicasts into the peer's stage while the peer's consumers read it."""
    def fix(op):
        op = _local_arrivals(op)
        if isinstance(op, MbarrierArrayOp) and op.result.name == "empty":
            return op.evolve(arrivals=op.arrivals // 2)
        return op

    with pytest.raises(VerifyError, match="stage .* of %sb .*(in flight|wgmma reading it)"):
        verify(_planted(_clustered(), fix))


def test_multicast_without_a_cluster_is_refused():
    def fix(op):
        return op.evolve(cluster=1) if isinstance(op, GridOp) else op

    with pytest.raises(VerifyError, match="CTAs form none"):
        verify(_planted(_clustered(k=128), fix))


def test_a_cluster_needs_whole_pairs_of_tile_rows():
    def fix(op):
        return op.evolve(group=3) if isinstance(op, GridOp) else op

    with pytest.raises(VerifyError, match="first dim and group are multiples"):
        verify(_planted(_clustered(k=128), fix))


@pytest.mark.parametrize("opts,why", [("cluster=2", "producer warpgroup"),
                                      ("producer=warpgroup,cluster=2,group=1", "multiple of 2"),
                                      ("producer=warpgroup,cluster=2,bn=64", "share of B's 64-column chunks")])
def test_a_cluster_needs_a_producer_warpgroup_an_even_group_and_chunks_of_b_for_each_cta(opts, why):
    with pytest.raises(KfcError, match=why):
        lowered(load_kfc("kernels/gemm.kfc"), {"M": 256, "N": 256, "K": 128},
                f"canonicalize,accelerate-matmul{{{opts}}}")


def test_tcgen05_refuses_a_cluster():
    with pytest.raises(KfcError, match="clusters are built for wgmma"):
        compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_100a"),
                   pipeline=f"canonicalize,{CLUSTER}}}", shape={"M": 256, "N": 256, "K": 128})


def test_the_clustered_gemm_builds_for_sm90a_with_multicast_loads():
    r = compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90a"),
                   pipeline=f"canonicalize,{CLUSTER},inflight=1}}", shape={"M": 4096, "N": 4096, "K": 4096})
    [entry] = r.report["kernels"]
    assert entry["cluster"] == [2, 1, 1] and entry["grid"] == ["512", "1", "1"]
    cu = r.kernel.cu
    assert cu.count("barrier.cluster.wait") == 2  # before the roles and before the CTAs exit
    sass = disassemble(r.kernel.cubin)
    assert "UTMALDG.2D.MULTICAST" in sass and "UCGABAR_WAIT" in sass and "HGMMA.64x256x16.F32.BF16" in sass
    assert r.kernel.report.spills == 0 and "C7514" not in r.kernel.ptxas_log


@pytest.mark.parametrize("opts", ["", ",inflight=1,bm=64,bn=128,stages=2", ",inflight=1,tiles=persistent,stages=3",
                                  ",inflight=1,registers=232,bm=128,bn=128,tiles=persistent,consumers=pingpong,"
                                  "stages=2,store=tma"])
def test_the_cluster_protocol_holds_under_many_schedules(opts, monkeypatch):
    """The barrier check walks a cluster's two CTAs' roles under 32 seeded interleavings, not 4:
    a producer far ahead of its peer's consumers, or the reverse, finds no hazard."""
    from kfc.ir import grid_protocol

    _, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 256, "N": 512, "K": 640}, f"canonicalize,{CLUSTER}{opts}}}")
    [grid] = [op for op in low.walk() if isinstance(op, GridOp)]
    monkeypatch.setattr(grid_protocol, "SCHEDULES", 32)
    monkeypatch.setattr(grid_protocol, "_SOUND", {})
    grid_protocol.check_grid_protocol(grid)
