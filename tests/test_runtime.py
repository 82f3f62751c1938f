"""The runtime's CPU-side behaviour: argument checks, type-parameter instances, the JIT cache,
and a clear message where a GPU is needed but absent."""

import pytest
import torch

import kfc
from kfc.diagnostics import KfcError
from kfc.runtime import cache
from kfc.runtime.kernel import cached_compile
from kfc.model.target import parse_target


@pytest.fixture
def rmsnorm():
    return kfc.load("kernels/rmsnorm.kfc", target="sm_90a")


def test_cpu_tensors_are_refused_clearly(rmsnorm):
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(KfcError, match="kernels run on the GPU"):
        rmsnorm(x, torch.randn(256))


def test_wrong_dtype_is_named(rmsnorm):
    w = rmsnorm.func.arg("w").ttype
    with pytest.raises(KfcError, match=r"'w' is torch.float16, the kernel takes f32"):
        rmsnorm.check_tensor("w", torch.randn(256, dtype=torch.float16), w, None)
    with pytest.raises(KfcError, match="must be a torch tensor"):
        rmsnorm.check_tensor("w", [1.0], w, None)


def test_type_parameters_follow_the_tensors(rmsnorm):
    inst = rmsnorm.instance_for({"x": torch.zeros(1, 8, dtype=torch.float16)})
    assert inst.spec.dtypes == {"T": "f16"} and inst.func.inputs[0].ttype.dtype.value == "f16"
    assert rmsnorm.instance_for({"x": torch.zeros(1, 8, dtype=torch.bfloat16)}) is rmsnorm
    with pytest.raises(KfcError, match="takes bf16 | f16 | f32"):
        rmsnorm.instance_for({"x": torch.zeros(1, 8, dtype=torch.int32)})


def test_argument_binding_errors(rmsnorm):
    with pytest.raises(KfcError, match="takes 3 inputs"):
        rmsnorm.bind((1, 2, 3, 4), {})
    with pytest.raises(KfcError, match="has no input 'z'"):
        rmsnorm.bind((), {"z": 1})
    with pytest.raises(KfcError, match="given twice"):
        rmsnorm.bind((1,), {"x": 1})


def test_no_gpu_is_one_clear_message(monkeypatch):
    from kfc.diagnostics import GpuUnavailable
    from kfc.runtime.kernel import current_target

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(GpuUnavailable, match="no CUDA GPU is visible"):
        current_target()


def test_jit_cache_stores_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("KFC_CACHE_DIR", str(tmp_path))
    spec = kfc.frontend.load_kfc("kernels/softmax.kfc")
    cubin, report = cached_compile(spec, parse_target("sm_90a"), None, {"M": 3, "N": 512})
    assert cubin[:4] == b"\x7fELF" and report["dims"] == {"N": 512}
    entries = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and not any(p.name.startswith(".") for p in tmp_path.iterdir())

    def no_compile(*a, **k):
        raise AssertionError("compiled again instead of reading the cache")

    monkeypatch.setattr("kfc.compile.compile_op", no_compile)
    again, _ = cached_compile(spec, parse_target("sm_90a"), None, {"M": 7, "N": 512})  # M is a run-time dim
    assert again == cubin


def test_cache_keys_separate_what_changes_the_binary():
    base = cache.cache_key("ir", "", "sm_90a", {"N": 4096}, "13.0")
    assert cache.cache_key("ir", "", "sm_90a", {"N": 4096}, "13.0") == base
    for other in [cache.cache_key("ir2", "", "sm_90a", {"N": 4096}, "13.0"),
                  cache.cache_key("ir", "tile", "sm_90a", {"N": 4096}, "13.0"),
                  cache.cache_key("ir", "", "sm_100a", {"N": 4096}, "13.0"),
                  cache.cache_key("ir", "", "sm_90a", {"N": 2048}, "13.0"),
                  cache.cache_key("ir", "", "sm_90a", {"N": 4096}, "12.8"),
                  cache.cache_key("ir", "", "sm_90a", {"N": 4096}, "13.0", "TILE_COLUMN_REGISTERS=True")]:
        assert other != base


def test_the_jit_key_of_a_kernel_follows_the_code_generators_switches(monkeypatch):
    """A kernel built with a switch of kfc.codegen.cuda set is not served to a process that set
    another (an A/B of two forms in one process, or one test beside another)."""
    from kfc.codegen import cuda
    from kfc.frontend import load_kfc
    from kfc.runtime.kernel import kernel_cache_key
    spec, target, dims = load_kfc("kernels/kda_recurrence.kfc", {"C": "16"}), parse_target("sm_90a"), {"T": 64}
    plain = kernel_cache_key(spec, target, None, dims)
    monkeypatch.setattr(cuda, "TILE_COLUMN_REGISTERS", not cuda.TILE_COLUMN_REGISTERS)
    assert kernel_cache_key(spec, target, None, dims) != plain


def test_the_jit_key_of_a_kernel_built_with_the_default_pipeline_follows_the_default(monkeypatch):
    """A kernel built with the default pipeline is not served once the default has changed."""
    import kfc.passes
    from kfc.frontend import load_kfc
    from kfc.runtime.kernel import kernel_cache_key
    spec, target, dims = load_kfc("kernels/kda_recurrence.kfc", {"C": "16"}), parse_target("sm_90a"), {"T": 64}
    plain = kernel_cache_key(spec, target, None, dims)
    assert kernel_cache_key(spec, target, kfc.passes.TILE_PIPELINE, dims) != plain  # named, not the default
    monkeypatch.setattr(kfc.passes, "TILE_PIPELINE", kfc.passes.TILE_PIPELINE.replace("approx-math,", ""))
    assert kernel_cache_key(spec, target, None, dims) != plain


def test_a_keyword_call_is_planned_as_the_positional_call_it_equals():
    from kfc.runtime.calls import keyword_plan

    names = ["x", "w", "b", "eps", "scale"]
    fill = {"b": None, "eps": 1e-6}  # an optional tensor and a defaulted scalar; scale's default depends on dims
    plan = keyword_plan(names, fill, 0, ("w", "x"))
    assert plan((), {"w": 2, "x": 1}) == (1, 2)
    plan = keyword_plan(names, fill, 2, ("eps",))  # b left out of the middle: None, as passing None is
    assert plan((1, 2), {"eps": 0.5}) == (1, 2, None, 0.5)
    plan = keyword_plan(names, fill, 0, ("scale", "w", "x"))
    assert plan((), {"scale": 3.0, "w": 2, "x": 1}) == (1, 2, None, 1e-6, 3.0)
    assert keyword_plan(names, {"b": None}, 0, ("x", "w", "scale")) is None  # eps has nothing to fill its gap
    assert keyword_plan(names, fill, 0, ("x", "scale")) is None  # w, a required tensor, is missing
    assert keyword_plan(names, fill, 2, ("x",)) is None  # given twice: the full path says so
    assert keyword_plan(names, fill, 0, ("y",)) is None  # unknown: the full path says so
    assert keyword_plan(names, fill, 1, ("w",))((1,), {"w": 2}) == (1, 2)


def test_prebuild_fills_the_jit_cache_at_each_shape_and_names_what_cannot_be_built(tmp_path, monkeypatch):
    """KfcKernel.prebuild: every shape's kernel built into the JIT cache before any call (the
    benchmarks' first calls then only load), several at once; a shape its pipeline refuses is one
    line naming the shape and why, not an exception."""
    import kfc
    from kfc.runtime.kernel import cache, kernel_cache_key

    monkeypatch.setenv("KFC_CACHE_DIR", str(tmp_path))
    pipe = "canonicalize,cse,dce,tile{threads=32},lower-reductions,lower-ptx,canonicalize,cse,dce"
    k = kfc.load("kernels/rmsnorm.kfc", target="sm_90a", pipeline=pipe, bind={"T": "bf16"})
    shapes = [{"M": 64, "N": 1024}, {"M": 64, "N": 2048}, {"M": 64, "N": 262144}]
    problems = k.prebuild(shapes, workers=2)
    assert len(problems) == 1 and "N': 262144" in problems[0] and "registers" in problems[0], problems
    for dims in shapes[:2]:
        assert cache.lookup(kernel_cache_key(k.spec, k.target, pipe, dims)) is not None


def test_an_instance_named_by_its_dtypes_is_the_one_a_call_with_such_tensors_takes(rmsnorm):
    """instance_named (what bench.ops prebuilds) and instance_for (what a call binds) agree; a
    name the op has no type parameter of is left out."""
    named = rmsnorm.instance_named({"T": "f16", "NOT_A_PARAM": "bf16"})
    assert named is rmsnorm.instance_for({"x": torch.empty(2, 4, dtype=torch.float16)})
    assert named.spec.dtypes["T"] == "f16"
