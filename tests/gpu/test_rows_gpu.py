"""Row kernels on the GPU: rmsnorm, layernorm and softmax, three pipelines each, in bf16, f16
and f32, against torch on fresh random inputs with NaN-poisoned outputs, for M in {1, 7, 32768}
and N in {1, 7, 256, 4095, 4096, 65536, 262144} where memory allows; and rows staged through
shared memory at every length (stage-rows{min_bytes=0}), one row or several per CTA, in a
persistent grid, in one stage or two (the next row's copy in flight), for M in {1, 7, 257,
32768} and rows whose last span is partial. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

OPS = ["rmsnorm", "layernorm", "softmax"]
PIPELINES = {
    "default": None,
    # persistent grid, no fused fma, exact functions, streaming cache hints
    "persistent-exact": "canonicalize,cse,dce,tile{persistent=true},lower-reductions,"
                        "lower-ptx{approx=off,stream=cs,store=cs},dce",
    # narrower vectors and more threads per row than the default
    "narrow": "canonicalize,cse,dce,tile{vec=2,rows=2},lower-reductions,fuse-reductions,lower-ptx{stream=none},"
              "canonicalize,cse,dce",
}
STAGED = "canonicalize,cse,dce,stage-rows{min_bytes=0},tile{%s},lower-reductions,fuse-reductions,lower-ptx," \
         "canonicalize,cse,dce"
PIPELINES["staged"] = STAGED % ""
# several rows per CTA (one barrier and buffer per row slot), the grid striding over the rows
PIPELINES["staged-persistent"] = STAGED % "rows=4,persistent=true"
# two stages: each CTA's next row copied while this one computes; with several row slots
PIPELINES["staged-2"] = STAGED % "stages=2"
PIPELINES["staged-2-slots"] = STAGED % "rows=4,stages=2"
# softmax's max and sum of exponentials as one reduction of (max, sum) pairs
PIPELINES["online"] = "canonicalize,cse,dce,online-softmax,stage-rows,tile,lower-reductions,fuse-reductions," \
                      "lower-ptx,canonicalize,cse,dce"
STAGED_NS = [8, 256, 4104, 65544, 262144]   # 4104 and 65544: the last span of the row is partial
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TOL = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-5}
MS = [1, 7, 32768]
NS = [1, 7, 256, 4095, 4096, 65536, 262144]
MAX_ELEMENTS = 1 << 30  # "where memory allows": the fp32 reference of the largest case is 4 GB

_kernels = {}


def kernel(op, pipeline):
    import kfc

    key = (op, pipeline)
    if key not in _kernels:
        _kernels[key] = kfc.load(f"kernels/{op}.kfc", pipeline=PIPELINES[pipeline])
    return _kernels[key]


def inputs(op, m, n, dtype, gen):
    x = torch.randn(m, n, device="cuda", dtype=torch.float32, generator=gen)
    if op == "softmax":
        return ((x * 3).to(dtype),)
    w = torch.randn(n, device="cuda", generator=gen)
    if op == "rmsnorm":
        return (x.to(dtype), w)
    b = torch.randn(n, device="cuda", generator=gen)
    return ((x + 1).to(dtype), w, b)


def reference(op, args):
    x = args[0].float()
    if op == "rmsnorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * args[1]
    if op == "layernorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), args[1], args[2], 1e-5)
    return torch.softmax(x, dim=-1)


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("pipeline", ["default", "persistent-exact", "narrow"])
@pytest.mark.parametrize("op", OPS)
def test_row_kernel_matches_torch(op, pipeline, dtype, n):
    check_against_torch(op, pipeline, dtype, n, MS)


@pytest.mark.parametrize("n", STAGED_NS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("pipeline", ["staged", "staged-persistent", "staged-2", "staged-2-slots"])
@pytest.mark.parametrize("op", OPS)
def test_staged_row_kernel_matches_torch(op, pipeline, dtype, n):
    check_against_torch(op, pipeline, dtype, n, [1, 7, 257, 32768])


def check_against_torch(op, pipeline, dtype, n, ms):
    requires_gpu()
    k = kernel(op, pipeline)
    gen = torch.Generator(device="cuda")
    for m in ms:
        if m * n > MAX_ELEMENTS:
            continue
        gen.manual_seed(hash((op, pipeline, dtype, m, n)) % (1 << 31))
        args = inputs(op, m, n, DTYPES[dtype], gen)
        before = [a.clone() for a in args]
        out = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
        got = k(*args, out=out)
        torch.cuda.synchronize()
        assert got.data_ptr() == out.data_ptr()
        ref = reference(op, args)
        o = got.float()
        assert torch.isfinite(o).all(), f"{op} {m}x{n}: {int((~torch.isfinite(o)).sum())} unwritten or non-finite"
        diff = (o - ref).abs()
        rms = ref.pow(2).mean().sqrt()
        rel = float(diff.pow(2).mean().sqrt() / rms)
        tol = TOL[dtype]
        worst = float((diff / (ref.abs() + rms)).max())
        assert rel <= tol and worst <= tol, f"{op} {pipeline} {dtype} {m}x{n}: rel RMSE {rel:.3g}, worst {worst:.3g}"
        for a, b in zip(args, before):
            assert torch.equal(a, b), f"{op} modified an input"


@pytest.mark.parametrize("n", NS + [65537, 262143])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_online_softmax_matches_torch(dtype, n):
    check_against_torch("softmax", "online", dtype, n, MS)


@pytest.mark.parametrize("n", [7, 1000, 4095, 4096, 65536, 65537, 262144])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("pipeline", ["default", "persistent-exact", "online"])
def test_softmax_of_masked_rows_matches_torch(pipeline, dtype, n):
    """Softmax, and the online (max, sum) pair, on rows whose leading elements are -inf (a causal mask: whole
    threads and CTAs of the cluster hold no finite element), a row of a single finite element,
    a row all -inf (NaN, as torch gives) and a row with a NaN, NaN-poisoned outputs."""
    requires_gpu()
    k = kernel("softmax", pipeline)
    m = 9
    gen = torch.Generator(device="cuda")
    gen.manual_seed(n)
    x = torch.randn(m, n, device="cuda", generator=gen) * 3
    for r in range(5):  # masked from the left, ever further
        x[r, : (r + 1) * n // 6] = float("-inf")
    x[5, :-1] = float("-inf")
    x[6, :] = float("-inf")
    x[7, n // 2] = float("nan")
    x = x.to(DTYPES[dtype])
    out = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
    got = k(x, out=out).float()
    torch.cuda.synchronize()
    ref = torch.softmax(x.float(), dim=-1)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), "NaN exactly where torch has NaN"
    ok = ~torch.isnan(ref)
    assert float((got[ok] - ref[ok]).abs().max()) <= TOL[dtype] * 2
    assert torch.allclose(got[5], ref[5], rtol=TOL[dtype])


def test_wrong_dtype_and_device_are_clear_errors():
    requires_gpu()
    from kfc.diagnostics import KfcError

    k = kernel("rmsnorm", "default")
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(KfcError, match="the kernel takes f32"):
        k(x, torch.randn(256, device="cuda", dtype=torch.float16))
    with pytest.raises(KfcError, match="kernels run on the GPU"):
        k(x, torch.randn(256))
    with pytest.raises(KfcError, match="not contiguous"):
        k(torch.randn(256, 4, device="cuda", dtype=torch.bfloat16).t(), torch.randn(4, device="cuda"))
    with pytest.raises(KfcError, match="shape symbol N"):
        k(x, torch.randn(255, device="cuda"))


def test_custom_op_and_streams():
    requires_gpu()
    k = kernel("softmax", "default")
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    inst = k.instance_for({"x": x})
    op = inst.as_torch_op()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = op(x)
    s.synchronize()
    ref = torch.softmax(x.float(), -1)
    assert float((y.float() - ref).abs().max()) < 1e-2
