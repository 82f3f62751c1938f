"""The launch contract (kfc.runtime.contract) without a GPU: compile writes one kernel with a
3-D grid of dims, its expressions evaluate without eval, a persistent grid is capped at a
wave, and what a runtime cannot launch is refused by name."""

import pytest

from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc
from kfc.runtime import contract
from kfc.model.target import parse_target


def test_a_row_kernel_s_contract():
    result = compile_op(load_kfc("kernels/rmsnorm.kfc", {"T": "bf16"}), parse_target("sm_90a"), shape={"N": 4096})
    (k,) = result.report["kernels"]
    assert k["name"] == "kfc_kernel_rmsnorm" and k["block"] == [result.plan.block, 1, 1]
    # a row of 8 KB is staged through shared memory: this CTA's part of one row, dynamic
    assert k["smem_dynamic_bytes"] == 4096 * 2 and k["cluster"] == [1, 1, 1]
    assert k["smem_static_bytes"] == result.plan.smem_static and not contract.needs_smem_opt_in(k)
    r = result.plan.rows_per_cta
    for m in (0, 1, r - 1, r, r + 1, 32768):
        assert contract.grid(k, {"M": m, "N": 4096}) == (-(-m // r), 1, 1)
    assert [p["kind"] for p in k["params"]] == ["tensor", "tensor", "scalar", "tensor", "dim"]


def test_a_clustered_kernel_launches_a_cluster_per_row():
    result = compile_op(load_kfc("kernels/softmax.kfc", {"T": "bf16"}), parse_target("sm_90a"), shape={"N": 262144})
    (k,) = result.report["kernels"]
    c = k["cluster"][0]
    assert c > 1 and contract.grid(k, {"M": 5, "N": 262144}) == (5 * c, 1, 1)


def test_persistent_grids_are_capped_at_a_wave():
    k = {"grid": ["(M + 7) // 8 * 2", "1", "1"], "cluster": [2, 1, 1], "persistent": True}
    assert contract.grid(k, {"M": 10**6}, clusters_per_wave=132) == (264, 1, 1)
    assert contract.grid(k, {"M": 9}, clusters_per_wave=132) == (4, 1, 1)
    assert contract.grid(dict(k, persistent=False), {"M": 10**6}, clusters_per_wave=132) == (250000, 1, 1)


class _Function:
    """A loaded kernel's occupancy queries, stood in for: 3 CTAs an SM, 45 clusters of 8 (the
    H200's GPCs hold fewer clusters than 132 SMs x 3 / 8 = 49)."""

    def __init__(self):
        self.calls = []

    def allow_dynamic_smem(self, nbytes):
        self.calls.append("smem")

    def allow_large_clusters(self):
        self.calls.append("large")

    def max_active_blocks(self, block, smem):
        self.calls.append("blocks")
        return 3

    def max_active_clusters(self, block, smem, cluster):
        self.calls.append(("clusters", block, smem, cluster))
        return {8: 45, 16: 8}[cluster]


def test_a_persistent_cluster_grid_is_one_wave_of_the_clusters_the_gpu_holds():
    k = {"grid": ["M * 8", "1", "1"], "block": [256, 1, 1], "cluster": [8, 1, 1], "persistent": True,
         "smem_dynamic_bytes": 65536}
    f = _Function()
    assert contract.prepare_function(k, {"M": 32768}, f, sm_count=132) == (360, 1, 1)
    assert f.calls == ["smem", ("clusters", 256, 65536, 8)]
    # clusters past 8 are allowed before the query counts them
    f = _Function()
    k16 = dict(k, grid=["M * 16", "1", "1"], cluster=[16, 1, 1])
    assert contract.prepare_function(k16, {"M": 32768}, f, sm_count=132) == (128, 1, 1)
    assert f.calls == ["smem", "large", ("clusters", 256, 65536, 16)]
    # single CTAs: SMs x CTAs an SM holds
    f = _Function()
    k1 = dict(k, grid=["M", "1", "1"], cluster=[1, 1, 1], smem_dynamic_bytes=0)
    assert contract.prepare_function(k1, {"M": 32768}, f, sm_count=132) == (396, 1, 1)
    assert f.calls == ["blocks"]


@pytest.mark.parametrize("expr,value", [("max(0, (M) - (0))", 7), ("min(M, 3) * 2 + N % 5", 8), ("-M + 10", 3),
                                        ("(M + 3) // 4", 2)])
def test_expressions(expr, value):
    assert contract.evaluate(expr, {"M": 7, "N": 7}) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "M.bit_length()", "M ** 2", "M / 2", "open", "M +", "1 // 0",
                                  "[M]"])
def test_anything_else_is_refused(expr):
    with pytest.raises(KfcError):
        contract.evaluate(expr, {"M": 7})


def test_what_this_runtime_cannot_launch_is_refused_by_name():
    one = {"name": "k", "grid": ["1", "1", "1"], "params": [{"name": "a", "kind": "tensor"}]}
    assert contract.single_kernel({"kernels": [one]}, "op") is one
    with pytest.raises(KfcError, match="compiles to 2 kernels"):
        contract.single_kernel({"kernels": [one, one]}, "op")
    with pytest.raises(KfcError, match="tensormap parameter \\(desc_a\\)"):
        contract.single_kernel({"kernels": [dict(one, params=[{"name": "desc_a", "kind": "tensormap"}])]}, "op")
    with pytest.raises(KfcError, match="no launch contract"):
        contract.single_kernel({"launch": {}}, "op")
