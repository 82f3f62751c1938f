"""The benchmark tools' CPU side: bench.ab's export of an earlier kfc as a folder the GPU machine
can import, and its errors; bench.profile_ops reading an Nsight Compute CSV back. The timing and
the profiling themselves run on the GPU machine."""

import subprocess
import sys

import pytest

from bench import ab, profile_ops


def test_an_earlier_commit_exports_as_an_importable_folder(tmp_path):
    rev = subprocess.run(["git", "rev-parse", "HEAD~1"], capture_output=True, text=True, check=True).stdout.strip()
    ab.export("HEAD~1", tmp_path)
    assert (tmp_path / "REV").read_text().strip() == rev
    assert (tmp_path / "grammars" / "kfc.lark").is_file()
    out = subprocess.run([sys.executable, "-c", "import kfc; print(kfc.__file__)"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "kfc" / "__init__.py")


def test_a_base_that_is_not_an_export_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ab.main(["--base", str(tmp_path)])
    assert e.value.code == 2 and "--export REV DIR" in capsys.readouterr().err


NCU_CSV = """==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name"
"0","1","python3","h","kfc_kernel_fp8_quant","1","7","(256, 1, 1)","(32768, 1, 1)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","73.53",
"0","1","python3","h","kfc_kernel_fp8_quant","1","7","(256, 1, 1)","(32768, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","ns","158,560",
"0","1","python3","h","kfc_kernel_fp8_quant","1","7","(256, 1, 1)","(32768, 1, 1)","0","9.0","Compute Workload Analysis","Issued Ipc Active","inst/cycle","3.00",
"0","1","python3","h","kfc_kernel_fp8_quant","1","7","(256, 1, 1)","(32768, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","inst","5.10",
"0","1","python3","h","kfc_kernel_fp8_quant","1","7","(256, 1, 1)","(32768, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","inst","1.80",
"1","1","python3","h","kfc_kernel_router","1","7","(256, 1, 1)","(16384, 1, 1)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","78.00",
"""


def test_an_ncu_log_reads_back_as_a_line_a_kernel(tmp_path):
    path = tmp_path / "prof.csv"
    path.write_text(NCU_CSV)
    fp8, router = profile_ops.table(str(path))
    assert fp8.startswith("kfc_kernel_fp8_quant") and "t_ns=158560" in fp8 and "dram%=73.53" in fp8
    assert "ipc=3.00" in fp8 and fp8.endswith("| long_scoreboard=5.1 wait=1.8")
    assert router.startswith("kfc_kernel_router") and "dram%=78.00" in router and "regs=?" in router


def test_bench_kda_reads_its_cases_as_flashkdas_benchmark_writes_them():
    from bench.kda import CASES, parse_case

    assert parse_case("T=8192:H=96") == ([8192], 96)
    assert parse_case("varlen=1300+547+2048:H=64") == ([1300, 547, 2048], 64)
    assert parse_case("varlen=8x1024:H=96") == ([1024] * 8, 96)
    assert [parse_case(c)[1] for c in CASES] == [96, 64, 96, 96]


def test_bench_kda_judges_an_output_by_its_relative_rmse_not_element_by_element():
    import torch

    from bench.kda import TOL, off

    ref = torch.randn(4096, dtype=torch.float64)
    near = ref * (1 + 1e-3 * torch.randn(4096, dtype=torch.float64))
    near[7] = ref[7] + 0.1 * ref.abs().max()  # one element far off, as FlashKDA's bf16 products leave some
    assert off(near, ref) == ""
    assert "rel RMSE" in off(ref * (1 + 3 * TOL), ref)
    unwritten = near.clone()
    unwritten[3] = float("nan")
    assert "1 not finite" in off(unwritten, ref)


def test_bench_kda_sets_the_code_generators_switches_by_name(monkeypatch):
    from bench.kda import main, set_codegen
    from kfc.codegen import cuda

    monkeypatch.setattr(cuda, "TILE_COLUMN_REGISTERS", False)
    assert "TILE_COLUMN_REGISTERS=True" in set_codegen("TILE_COLUMN_REGISTERS=True")
    assert cuda.TILE_COLUMN_REGISTERS is True
    with pytest.raises(ValueError, match="no switch of kfc.codegen.cuda; the switches: TILE_PREFETCH"):
        set_codegen("TILE_COLUMNS=True")
    with pytest.raises(ValueError, match="Python literal"):
        set_codegen("TILE_DOUBLE_BUFFER=yes")
    with pytest.raises(SystemExit):  # argparse's error: one message, exit 2, before any GPU work
        main(["--codegen", "NOPE=1"])



def test_bench_kda_times_a_kfc_calls_kernels_apart(monkeypatch):
    """--parts: kernel_launches records each kernel flash_kda_fwd launches through kfc.nn.kda.run
    (the split pair's two), each relaunched alone on the same tensors, and leaves run as it was."""
    import torch

    import kfc.nn.kda as kda
    from bench.kda import kernel_launches, main

    launched = []
    fake = lambda name, bind, given, outs, pipeline=None: launched.append((name, bind["C"], given["x"]))  # noqa: E731
    monkeypatch.setattr(kda, "run", fake)
    x = torch.zeros(3)

    def call():
        kda.run("kda_prepare_flashkda", {"C": 16, "WD": "f32"}, {"x": x}, ())
        kda.run("kda_recurrence", {"C": 16}, {"x": x}, ())

    launches = kernel_launches(call)
    assert [label for label, _ in launches] == ["kda_prepare_flashkda[C=16,WD=f32]", "kda_recurrence[C=16]"]
    assert kda.run is fake and len(launched) == 2
    launches[1][1]()
    assert launched[-1] == ("kda_recurrence", 16, x)
    with pytest.raises(SystemExit):
        main(["--help"])


def test_bench_kda_times_kfcs_fla_interface_as_fla_is_called_where_asked(monkeypatch):
    """--fla: kfc.nn.kda.chunk_kda, split and not, called with the arguments fla's chunk_kda gets
    (FlashKDA's gate mode, the state [K, V]-first), each returning o and the state V-first, the
    two equal to FlashKDA's form (flash_kda_fwd) on the interpreter; absent without --fla."""
    import torch

    import kfc.nn.kda as kda
    from bench.kda import contenders
    from tests.test_kda_entry import interpreted

    monkeypatch.setattr(kda, "run", interpreted)
    g = torch.Generator().manual_seed(0)
    T, H, D = 21, 1, 16
    x = dict(q=torch.randn(1, T, H, D, generator=g).bfloat16(), k=torch.randn(1, T, H, D, generator=g).bfloat16(),
             v=torch.randn(1, T, H, D, generator=g).bfloat16(), g=torch.randn(1, T, H, D, generator=g).bfloat16(),
             beta=torch.randn(1, T, H, generator=g).bfloat16(), A_log=torch.rand(H, generator=g),
             dt_bias=torch.rand(H, D, generator=g), cu_seqlens=torch.tensor([0, 9, T]),
             h0=torch.randn(2, H, D, D, generator=g) * 0.1)
    calls = contenders(x, [16], fla_interface=True)
    assert "kfc chunk_kda[C=16,one kernel]" not in contenders(x, [16])
    results = {n: calls[n]() for n in ("kfc[C=16]", "kfc chunk_kda[C=16,pair]", "kfc chunk_kda[C=16,one kernel]")}
    (o, ht) = results["kfc[C=16]"]
    for name in ("kfc chunk_kda[C=16,pair]", "kfc chunk_kda[C=16,one kernel]"):
        got_o, got_ht = results[name]
        assert torch.allclose(got_o.float(), o.float(), atol=2e-2), name
        assert torch.allclose(got_ht.float(), ht.float(), atol=2e-3), name


def test_bench_gemm_builds_every_kernel_before_timing(tmp_path, monkeypatch, capsys):
    """bench.harness.prebuild (bench.gemm, bench.ops): each contender's kernels at every shape built
    at once into the JIT cache (the timed loop then only loads them), a refused one named, not raised."""
    import kfc
    from bench import harness

    monkeypatch.setenv("KFC_CACHE_DIR", str(tmp_path))
    k = kfc.load("kernels/gemm.kfc", target="sm_90a", kb=False,
                 pipeline="accelerate-matmul{producer=warpgroup,inflight=1,cluster=2}")
    harness.prebuild([(k, [{"M": 130, "N": 264, "K": 200}, {"M": 1, "N": 8, "K": 8}])])
    err = capsys.readouterr().err
    assert "prebuilt 2 kernel(s)" in err
    # ptxas 13.0 spills the clustered kernel at M = 1 alone (docs/gemm.md); another ptxas may not
    assert "not built" not in err or "'M': 1" in err.split("not built")[1]


def test_a_variant_sets_the_options_of_the_passes_it_names_and_nothing_else():
    from bench.variants import variant_pipeline
    from kfc.passes import ROW_PIPELINE

    p = variant_pipeline(ROW_PIPELINE, "lower-ptx{stream=none,store=none}+tile{threads=128}")
    assert p == ROW_PIPELINE.replace("lower-ptx", "lower-ptx{stream=none,store=none}").replace(
        ",tile,", ",tile{threads=128},")
    with pytest.raises(ValueError, match="a pass of"):
        variant_pipeline(ROW_PIPELINE, "accelerate-matmul{bn=128}")  # not a pass of the row pipeline
    with pytest.raises(ValueError, match="a pass of"):
        variant_pipeline(ROW_PIPELINE, "tile")
    from kfc.diagnostics import KfcError
    with pytest.raises(KfcError, match="threads"):
        variant_pipeline(ROW_PIPELINE, "tile{threads=100}")  # not a power of two


@pytest.mark.parametrize("argv,words", [
    (["--variant", "T128"], "NAME=PASS"),
    (["--variant", "D=tile{threads=128}"], "NAME not D"),
    (["--variant", "X=tile{nothreads=1}"], "nothreads"),
    (["--variant", "X=tile{threads=128}", "--ops", "no_such_op"], "unknown op"),
])
def test_bench_variants_refuses_a_bad_variant_before_any_gpu_work(argv, words, capsys):
    from bench import variants

    with pytest.raises(SystemExit) as e:
        variants.main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err
