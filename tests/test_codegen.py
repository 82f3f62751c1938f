"""Code generation and the toolchain, on the CPU: every row kernel compiles through ptxas for
sm_90a and sm_100a without spills; the PTX templates and one generated kernel are pinned."""

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kfc.cli import main
from kfc.codegen import float16, ptx
from kfc.codegen.toolchain import find_toolchain, parse_ptxas_report
from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc
from kfc.model.target import parse_target
from tests.vocabulary_loss import XENT

pytestmark = pytest.mark.xdist_group("codegen")  # on one pytest-xdist worker: it compiles every row kernel once

GOLDEN = Path("tests/golden/codegen")
ROW_KERNELS = ["rmsnorm", "layernorm", "softmax"]


def _compile(job):
    name, dtype, n, target = job
    spec = load_kfc(f"kernels/{name}.kfc", {"T": dtype})
    return job, compile_op(spec, parse_target(target), shape={"N": n})


JOBS = ([(k, d, 4096, t) for k in ROW_KERNELS for d in ("bf16", "f16", "f32") for t in ("sm_90a", "sm_100a")]
        + [(k, "bf16", n, t) for k in ROW_KERNELS for n in (7, 65536, 262144) for t in ("sm_90a", "sm_100a")])


@pytest.fixture(scope="module")
def compiled():
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(_compile, JOBS))


def test_every_row_kernel_compiles_without_spills(compiled):
    assert len(compiled) == len(JOBS)
    for (name, dtype, n, target), r in compiled.items():
        rep = r.kernel.report
        assert r.kernel.cubin[:4] == b"\x7fELF", (name, target)
        assert rep.spills == 0 and rep.stack_bytes == 0, (name, dtype, n, target, rep)
        assert 0 < rep.registers * r.plan.block <= 65536
        assert r.arch == target
        assert f".target {target}" in r.kernel.ptx


def test_long_rows_use_a_cluster_and_distributed_shared_memory(compiled):
    r = compiled[("rmsnorm", "bf16", 262144, "sm_90a")]
    assert r.plan.cluster > 1
    for instr in ("mapa.shared::cluster", "st.async.shared::cluster.mbarrier::complete_tx::bytes",
                  "mbarrier.try_wait.parity", "barrier.cluster.wait"):
        assert instr in r.kernel.cu and instr in r.kernel.ptx, instr


def test_cu_holds_inline_ptx_for_loads_stores_and_reductions(compiled):
    staged = compiled[("rmsnorm", "bf16", 4096, "sm_90a")].kernel.cu  # 8 KB rows go through shared memory
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in staged
    assert "mbarrier.arrive.expect_tx" in staged and "mbarrier.try_wait.parity" in staged
    assert "ld.shared.v4.b32" in staged
    cu = compiled[("rmsnorm", "bf16", 7, "sm_90a")].kernel.cu  # not a 16-byte multiple: registers
    assert "cp.async.bulk" not in cu and "@p ld.global.cs" in cu
    assert "st.global.cs.v4.b32" in staged
    assert "shfl.sync.bfly.b32" in staged and "bar.sync" in staged and "st.shared.f32" in staged
    assert staged.count("asm volatile") >= 6


def test_generated_kernel_matches_golden():
    """The whole .cu of one kernel is pinned; KFC_UPDATE_GOLDEN=1 rewrites it after a reviewed change."""
    r = compile_op(load_kfc("kernels/rmsnorm.kfc"), parse_target("sm_90a"), shape={"N": 4096})
    path = GOLDEN / "rmsnorm_bf16_N4096_sm_90a.cu"
    if os.environ.get("KFC_UPDATE_GOLDEN"):
        path.write_text(r.kernel.cu)
    assert r.kernel.cu == path.read_text()


def _ptx_body(ptx: str) -> str:
    """The PTX without nvcc's comment lines (they name the compiler build)."""
    return "\n".join(line for line in ptx.splitlines() if not line.lstrip().startswith("//")) + "\n"


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_generated_ptx_matches_golden(target):
    """The PTX nvcc makes of the pinned .cu, for both targets (toolchain 13.0, as in CI);
    KFC_UPDATE_GOLDEN=1 rewrites it after a reviewed change."""
    r = compile_op(load_kfc("kernels/rmsnorm.kfc"), parse_target(target), shape={"N": 4096})
    path = GOLDEN / f"rmsnorm_bf16_N4096_{target}.ptx"
    if os.environ.get("KFC_UPDATE_GOLDEN"):
        path.write_text(_ptx_body(r.kernel.ptx))
    assert _ptx_body(r.kernel.ptx) == path.read_text()


def test_ptx_templates_are_pinned():
    assert ptx.ld_global(["a", "b"], "p", None, "cs") == \
        'asm volatile("ld.global.cs.v2.b32 {%0, %1}, [%2];" : "+r"(a), "+r"(b) : "l"(p));'
    assert ptx.ld_global(["a"], "p", "ok", "nc_na") == (
        'asm volatile("{\\n .reg .pred p;\\n setp.ne.b32 p, %2, 0;\\n @p ld.global.nc.L1::no_allocate.b32 %0, [%1];'
        '\\n}" : "+r"(a) : "l"(p), "r"((int)(ok)));')
    assert ptx.st_global(["a", "b", "c", "d"], "p", None) == \
        'asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");'
    assert ptx.bar_sync() == 'asm volatile("bar.sync 0;" ::: "memory");'
    assert ptx.st_async_f32("ra", "v", "rb") == (
        'asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" '
        ':: "r"(ra), "r"(__float_as_uint(v)), "r"(rb) : "memory");')
    assert ptx.mbarrier_arrive_expect_tx("m", 16) == \
        'asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 16;" :: "r"(m) : "memory");'
    assert ptx.cluster_arrive() == 'asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");'
    assert ptx.cluster_arrive(relaxed=True) == 'asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");'
    assert ptx.shfl_bfly("x", 8) == "kfc_shfl_bfly(x, 8)"
    for fn in ("kfc_shfl_bfly", "kfc_rsqrt_approx", "kfc_ex2_approx", "kfc_cvt_pack_bf16", "kfc_mapa"):
        assert f"kfc_{fn[4:]}(" in ptx.PRELUDE
    assert "cvt.rn.bf16x2.f32 %0, %1, %2" in ptx.PRELUDE
    assert "shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff" in ptx.PRELUDE


@pytest.mark.parametrize("pipeline", [None, "canonicalize,cse,dce,stage-rows,tile{persistent=true},lower-reductions,"
                                      "fuse-reductions,lower-ptx,canonicalize,cse,dce"])
def test_a_cluster_publishes_its_mbarrier_inits_with_a_relaxed_arrive_and_orders_its_slots_with_a_release(pipeline):
    """A release arrive before the first row would cost each CTA a GPU-wide membar (SASS
    MEMBAR.ALL.GPU + ERRBAR): after fence.mbarrier_init a relaxed one publishes the inits. The
    arrive between rows still releases, so a peer's next values never overwrite unread slots."""
    r = compile_op(load_kfc("kernels/softmax.kfc"), parse_target("sm_90a"), pipeline=pipeline, shape={"N": 65536})
    cu = r.kernel.cu
    loop = cu.index("for (long long kfc_base")
    setup, body = cu[:loop], cu[loop:]
    assert setup.count("barrier.cluster.arrive") == 1
    assert setup.index("fence.mbarrier_init.release.cluster") < setup.index("barrier.cluster.arrive.relaxed.aligned")
    assert body.count("barrier.cluster.arrive.release.aligned") == 1
    assert body.index("barrier.cluster.wait.acquire.aligned") < body.index("barrier.cluster.arrive.release.aligned")


def test_a_kernel_defines_the_device_functions_it_calls_and_no_others(compiled):
    """PTX helpers are emitted only when used: rmsnorm takes rsqrt and no exponential, softmax the
    exponential and no rsqrt; each used one is defined once."""
    rms = compiled[("rmsnorm", "bf16", 4096, "sm_90a")].kernel.cu
    soft = compiled[("softmax", "bf16", 4096, "sm_90a")].kernel.cu
    assert "kfc_rsqrt_approx(float x)" in rms and "kfc_ex2_approx" not in rms
    assert "kfc_ex2_approx(float x)" in soft and "kfc_rsqrt_approx" not in soft
    for cu in (rms, soft):
        assert "kfc_shfl_up_f32" not in cu and "kfc_floordiv" not in cu
        defined = re.findall(r"__forceinline__ [\w ]+? (kfc_\w+)\(", cu)
        called = set(re.findall(r"(kfc_\w+)\(", cu.split("__global__")[1])) & {*ptx.DEVICE_FUNCTIONS, *float16.FUNCTIONS}
        assert len(defined) == len(set(defined)) and set(defined) == called


def test_ptxas_report_parsing():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 16 bytes spill stores, 24 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 64 bytes smem, 400 bytes cmem[0]\n")
    r = parse_ptxas_report(log)
    assert (r.registers, r.stack_bytes, r.spill_stores, r.spill_loads, r.smem_bytes, r.barriers, r.cmem_bytes) == \
        (40, 8, 16, 24, 64, 1, 400)
    assert r.spills == 40


# --- kfc compile: the acceptance commands and bad input -------------------------------------

@pytest.mark.parametrize("target", ["sm_100", "sm_90a"])
def test_kfc_compile_rmsnorm(tmp_path, capsys, target):
    out = tmp_path / "out"
    assert main(["compile", "kernels/rmsnorm.kfc", "--target", target, "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["report.json", "rmsnorm.cu", "rmsnorm.cubin", "rmsnorm.kir", "rmsnorm.ptx"]
    import json

    report = json.loads((out / "report.json").read_text())
    assert report["ptxas"]["spill_stores"] == 0 and report["ptxas"]["spill_loads"] == 0
    assert report["target"] == target and report["dynamic_dims"] == ["M"]
    assert "asm volatile" in (out / "rmsnorm.cu").read_text()
    text = capsys.readouterr().out
    assert "0 spill bytes" in text
    if target == "sm_100":
        assert "proven by ptxas only" in text


def test_unknown_target_is_a_clear_error(capsys):
    assert main(["compile", "kernels/rmsnorm.kfc", "--target", "sm_80"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'sm_80'" in err and "sm_90a" in err and "Traceback" not in err


def test_missing_toolchain(monkeypatch, capsys):
    monkeypatch.setenv("KFC_NVCC", "/nonexistent/nvcc")
    find_toolchain.cache_clear()
    try:
        assert main(["compile", "kernels/rmsnorm.kfc", "--target", "sm_90a", "-o", "/tmp/kfc-never"]) == 2
    finally:
        find_toolchain.cache_clear()
    err = capsys.readouterr().err
    assert "KFC_NVCC points at /nonexistent/nvcc" in err and not Path("/tmp/kfc-never").exists()


def test_too_old_toolchain(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.0, V12.0.76'\n")
    fake.chmod(0o755)
    (tmp_path / "ptxas").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "ptxas").chmod(0o755)
    monkeypatch.setenv("KFC_NVCC", str(fake))
    find_toolchain.cache_clear()
    try:
        with pytest.raises(KfcError, match="nvcc 12.0 is too old"):
            find_toolchain()
    finally:
        find_toolchain.cache_clear()


def test_register_spills_are_reported_with_numbers(capsys):
    # 128 elements of two fp32 rows per thread at 512 threads: more than 128 registers hold
    pipe = "canonicalize,tile{threads=512,cluster=1},lower-reductions,lower-ptx"
    assert main(["compile", "kernels/softmax.kfc", "--shape", "N=65536", "-p", pipe, "-o", "/tmp/kfc-never"]) == 2
    err = capsys.readouterr().err
    assert "spills registers to local memory" in err and "bytes stored" in err and "128 registers" in err
    assert not Path("/tmp/kfc-never").exists()


def test_a_share_of_the_row_too_large_for_registers_is_refused_before_nvcc(capsys):
    pipe = "canonicalize,tile{threads=64,cluster=1},lower-reductions,lower-ptx"
    assert main(["compile", "kernels/rmsnorm.kfc", "--shape", "N=65536", "-p", pipe, "-o", "/tmp/kfc-never"]) == 2
    err = capsys.readouterr().err
    assert "leaves 1024 elements per thread; at most 128 fit in registers" in err
    assert "threads x cluster >= 512" in err


def test_ops_without_a_code_generator_say_so(capsys, tmp_path):
    # whole tiles summed across the parallel loop's iterations: neither rows nor what the tile
    # emitter takes
    (tmp_path / "acc.kfc").write_text("""
op acc(x: f32[B, 8, 8]) -> (y: f32[8, 8]) {
  parallel b in 0..B {
    y[:, :] += x[b, :, :] * 2.0
  }
}
""")
    assert main(["compile", str(tmp_path / "acc.kfc"), "--shape", "B=4", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot generate code for acc yet" in err and "nor does the tile emitter take it" in err and "hint:" in err


def test_a_bad_pipeline_is_reported(capsys):
    assert main(["compile", "kernels/rmsnorm.kfc", "-p", "canonicalize,tiel"]) == 2
    err = capsys.readouterr().err
    assert "unknown pass 'tiel'" in err and "did you mean tile" in err


def test_verify_each_through_compile(tmp_path):
    assert main(["compile", "kernels/softmax.kfc", "--shape", "N=1000", "--verify-each", "-o", str(tmp_path)]) == 0


def test_every_scalar_access_stays_inside_its_tensor(tmp_path):
    """A CTA holds several rows and M need not be a multiple of them, and an index read from
    memory (a label) can be anything: each one-element load and store is predicated on the row
    being the op's and on every index lying in its dim."""
    import re

    from kfc.frontend import parse_kfc

    spec = parse_kfc(XENT, str(tmp_path / "xent.kfc"))
    result = compile_op(spec, parse_target("sm_90a"), shape={"N": 1000})
    assert result.plan.rows_per_cta > 1
    accesses = [line for line in result.kernel.cu.splitlines() if re.search(r"p_(x|label|loss)\[", line)]
    assert len(accesses) == 3, accesses
    for line in accesses:
        assert re.search(r"if \(.*kfc_rowvalid.*\(unsigned long long\)\(kfc_m\) < \(unsigned long long\)\(dim_M\)", line), line
    (x_load,) = [a for a in accesses if "p_x[" in a]
    assert "< (unsigned long long)(1000LL)" in x_load, "the label-indexed load is bounded by N"


NEW_ROW_KERNELS = ["rmsnorm_residual", "rmsnorm_bwd_dx", "rmsnorm_bwd", "layernorm_bwd_dx", "layernorm_bwd", "softmax_bwd"]
NEW_JOBS = ([(k, "bf16", n, "sm_90a") for k in NEW_ROW_KERNELS for n in (7, 4096, 65537, 262144)]
            + [(k, "f32", 262144, "sm_90a") for k in NEW_ROW_KERNELS]
            + [(k, "bf16", 4096, "sm_100a") for k in NEW_ROW_KERNELS])


@pytest.mark.slow
def test_the_backward_and_residual_kernels_build_without_spills_at_every_length():
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for (name, dtype, n, target), result in pool.map(_compile, NEW_JOBS):
            assert result.kernel.report.spills == 0, (name, dtype, n, target)


@pytest.mark.parametrize("n", [128256, 256000])
def test_a_loss_over_a_vocabulary_builds_with_the_default_pipeline(tmp_path, n):
    """Rows that do not split evenly across a cluster (vocabularies of 128256 and 256000) get
    a smaller share per thread, so the bounds predicates do not spill."""
    from kfc.frontend import parse_kfc

    spec = parse_kfc(XENT, str(tmp_path / "xent.kfc"))
    result = compile_op(spec, parse_target("sm_90a"), shape={"N": n})
    assert result.kernel.report.spills == 0 and result.plan.cluster > 1


ALL_ROW_KERNELS = ["rmsnorm", "layernorm", "softmax", "rmsnorm_residual", "rmsnorm_bwd_dx", "rmsnorm_bwd", "layernorm_bwd_dx",
                   "layernorm_bwd", "softmax_bwd"]
# from one element to 262144, staged and in registers, rows that split evenly and ones that do not
SWEEP_NS = [1, 7, 4104, 65537, 131072, 200000, 262143, 262144]


@pytest.mark.slow
def test_the_default_pipeline_builds_every_row_kernel_at_every_length_without_spills():
    jobs = [(k, "bf16", n, "sm_90a") for k in ALL_ROW_KERNELS for n in SWEEP_NS]
    # f32 rows of the kernels that also sum across rows: twice the bytes beside the sums
    jobs += [(k, "f32", n, "sm_90a") for k in ("rmsnorm_bwd", "layernorm_bwd") for n in (200000, 262143, 262144)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = dict(pool.map(_compile, jobs))
    for (name, _, n, _), r in results.items():
        rep = r.kernel.report
        assert rep.spills == 0 and rep.stack_bytes == 0, (name, n, rep)
        staged = "cp.async.bulk" in r.kernel.cu
        shared_sums = "kfc_sums[" in r.kernel.cu  # sums across rows kept in shared memory
        assert (staged or shared_sums) == (r.plan.smem_dynamic > 0), (name, n)
        if n * 2 % 16:
            assert not staged, (name, n)  # not a 16-byte multiple: the row stays in registers
    # layernorm_bwd's dw and db in f32 at rows of 262144 leave room in shared memory for one of
    # its two rows: one is staged, the other stays in registers
    cu = results[("layernorm_bwd", "f32", 262144, "sm_90a")].kernel.cu
    assert cu.count("cp.async.bulk.shared") == 1 and "kfc_sums[" in cu


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_iota_of_a_dim_compiles_in_a_row_program(tmp_path, target):
    """argmax by iota(N): the front end sizes iota by a dim, the row passes keep it a row
    (recomputed per stretch when the row is staged), and codegen gives each element its index."""
    from kfc.frontend import parse_kfc
    from tests.argmax_op import ARGMAX

    path = str(tmp_path / "argmax.kfc")
    # odd rows move element by element: bf16 rows of 65537 take a larger cluster (33 elements a
    # thread spilled), rows of 262143 are read again in each stretch
    for n, dtype in ((7, "bf16"), (4096, "f32"), (65536, "bf16"), (65537, "f32"), (65537, "bf16"), (262143, "bf16")):
        spec = parse_kfc(ARGMAX, path, {"T": dtype})
        result = compile_op(spec, parse_target(target), shape={"M": 5, "N": n}, verify_each=True)
        assert result.kernel.report.spills == 0, (n, dtype)
        assert "(int)(" in result.kernel.cu and "kfc_g" in result.kernel.cu
        assert ("cp.async.bulk" in result.kernel.cu) == (n == 65536), (n, dtype)  # 128 KB, three stretches
