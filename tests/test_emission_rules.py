"""The code generator finds each op's emission rule by the op's class (kfc.codegen.rules)."""

import pytest

from kfc.codegen import cuda  # noqa: F401  (registers every rule module)
from kfc.codegen.rules import RULES, in_cluster, rule, rule_for, synchronises
from kfc.codegen.elementwise_rules import emit_unary
from kfc.codegen.memory_rules import emit_ld
from kfc.ir import gpu_ops, ptx_ops, smem_ops, tile_ops
from kfc.ir.core import Op

# every op a lowered row kernel holds inside its gpu.launch, and the launch itself
LOWERED = [
    gpu_ops.LaunchOp, gpu_ops.ThreadReduceOp, gpu_ops.WarpReduceOp, gpu_ops.CtaReduceOp, gpu_ops.ClusterReduceOp,
    gpu_ops.ThreadMaxSumExpOp, gpu_ops.WarpMaxSumExpOp, gpu_ops.CtaMaxSumExpOp, gpu_ops.ClusterMaxSumExpOp,
    gpu_ops.UniformOp, smem_ops.SmemAllocOp, smem_ops.MbarrierAllocOp, smem_ops.ExpectTxOp, smem_ops.CopyAsyncOp,
    smem_ops.CopyAsyncArriveOp, smem_ops.MbarrierWaitOp, ptx_ops.LdOp, ptx_ops.StOp, ptx_ops.RsqrtApproxOp,
    ptx_ops.Ex2ApproxOp, ptx_ops.CvtPackOp, tile_ops.ConstOp, tile_ops.IotaOp, tile_ops.DimOp, tile_ops.CmpOp,
    tile_ops.WhereOp, tile_ops.CastOp, tile_ops.BroadcastOp, tile_ops.ForOp, tile_ops.IfOp, tile_ops.ScanOp,
    tile_ops.YieldOp, *tile_ops.UNARY_CLASSES.values(), *tile_ops.BINARY_CLASSES.values(),
]


@pytest.mark.parametrize("cls", LOWERED, ids=lambda c: c.__name__)
def test_every_op_of_a_lowered_kernel_has_an_emission_rule(cls):
    assert rule_for(cls) is not None


def test_an_op_without_a_rule_of_its_own_takes_its_nearest_base_classs():
    assert rule_for(tile_ops.UNARY_CLASSES["exp"]) is emit_unary
    assert rule_for(ptx_ops.LdOp) is emit_ld


@pytest.mark.parametrize("cls", [tile_ops.LoadOp, tile_ops.StoreOp, tile_ops.ReduceOp, tile_ops.ParallelOp,
                                 tile_ops.MaxSumExpOp], ids=lambda c: c.__name__)
def test_tile_ops_that_passes_must_lower_have_no_rule(cls):
    # a refined op's rule (ptx.ld's) must not serve the op it refines (tile.load): codegen then
    # reports the unlowered op instead of emitting it as if a pass had chosen its vector width
    assert rule_for(cls) is None


def test_a_second_rule_for_one_op_class_is_refused():
    class Probe(Op):
        NAME = "test.probe"

    @rule(Probe)
    def first(em, op):
        pass

    try:
        with pytest.raises(ValueError, match="Probe has two emission rules: first and second"):
            @rule(Probe)
            def second(em, op):
                pass
    finally:
        RULES.pop(Probe)


def test_rules_say_which_ops_synchronise_the_cta_and_which_cross_the_cluster():
    """What the code around an op must know of it (a loop flips kfc_phase after a body that
    synchronises; the row loop waits for the cluster before its first exchange), said by the
    op's rule, for every op that has a rule."""
    synced = {cls for cls in RULES if synchronises(cls)}
    assert synced == {gpu_ops.CtaReduceOp, gpu_ops.ClusterReduceOp, gpu_ops.CtaMaxSumExpOp,
                      gpu_ops.ClusterMaxSumExpOp, tile_ops.ScanOp}
    assert {cls for cls in RULES if in_cluster(cls)} == {gpu_ops.ClusterReduceOp, gpu_ops.ClusterMaxSumExpOp}
    assert not synchronises(smem_ops.MbarrierWaitOp)  # a wait synchronises on its barrier, not on slots
