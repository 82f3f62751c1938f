"""The launch fast path on the GPU: a call whose signature was seen before skips binding and
re-checking but still refuses what can change between calls (contiguity, alignment), and any
other change of signature (dtype, shape, device, scalars, out=) takes the full path. Results
are checked against torch on NaN-poisoned outputs. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


def rms(x, w, eps=1e-6):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.fixture(scope="module", params=["c", "ctypes"])
def rmsnorm(request):
    """rmsnorm through the compiled launcher (fastcall.cpp) and the ctypes one kfc falls back to."""
    import kfc

    from kfc.runtime import fastcall

    k = kfc.load("kernels/rmsnorm.kfc")
    k._native = None if request.param == "ctypes" else fastcall.module()
    if request.param == "c":
        assert k._native is not None, "the compiled launcher must build on the GPU machine (see the warning above)"
    return k


def prepared(k) -> int:
    return len(k._launchers) if k._native else len(k._fast)


def close(a, b, tol=1e-2):
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all()
    rel = float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30))
    assert rel <= tol, rel


def test_repeated_calls_take_the_fast_path_and_stay_right(rmsnorm):
    requires_gpu()
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, dt in [(7, 4095, torch.bfloat16), (1, 256, torch.bfloat16), (300, 4096, torch.float16),
                     (7, 4095, torch.bfloat16), (33, 7, torch.float32)]:
        for _ in range(3):
            x = torch.randn(m, n, device="cuda", generator=g).to(dt)
            w = torch.randn(n, device="cuda", generator=g)
            close(rmsnorm(x, w), rms(x, w), 1e-2 if dt != torch.float32 else 1e-5)
    assert prepared(rmsnorm) >= 4, "signatures seen before are served by prepared calls"


def test_out_and_a_positional_scalar(rmsnorm):
    requires_gpu()
    x = torch.randn(9, 1024, device="cuda").to(torch.bfloat16)
    w = torch.randn(1024, device="cuda")
    for eps in (1e-6, 0.5, 2.0, 0.5):
        y = torch.full_like(x, float("nan"))
        got = rmsnorm(x, w, eps, out=y)
        assert got.data_ptr() == y.data_ptr()
        close(y, rms(x, w, eps))


def test_the_fast_path_still_refuses_bad_tensors(rmsnorm):
    requires_gpu()
    from kfc.diagnostics import KfcError

    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    w = torch.randn(512, device="cuda")
    rmsnorm(x, w)
    rmsnorm(x, w)
    wide = torch.randn(4, 1024, device="cuda").to(torch.bfloat16)
    with pytest.raises(KfcError, match="not contiguous"):
        rmsnorm(wide[:, ::2], w)
    flat = torch.randn(4 * 512 + 1, device="cuda").to(torch.bfloat16)
    with pytest.raises(KfcError, match="16-byte aligned"):
        rmsnorm(flat[1:].view(4, 512), w)
    with pytest.raises(KfcError, match="the kernel takes f32"):
        rmsnorm(x, w.half())
    with pytest.raises(KfcError, match="kernels run on the GPU"):
        rmsnorm(x, w.cpu())
    with pytest.raises(KfcError, match="out 'y' is"):
        rmsnorm(x, w, out=torch.empty(4, 256, device="cuda", dtype=torch.bfloat16))
    close(rmsnorm(x, w), rms(x, w))


def test_no_rows_launches_nothing_and_returns_an_empty_output(rmsnorm):
    requires_gpu()
    x = torch.randn(0, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, device="cuda")
    for _ in range(2):
        assert rmsnorm(x, w).shape == (0, 256)


def test_cuda_graph_capture_and_other_streams(rmsnorm):
    requires_gpu()
    x = torch.randn(64, 2048, device="cuda").to(torch.bfloat16)
    w = torch.randn(2048, device="cuda")
    y = torch.empty_like(x)
    rmsnorm(x, w, out=y)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            rmsnorm(x, w, out=y)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rmsnorm(x, w, out=y)
    x.copy_(torch.randn_like(x))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    close(y, rms(x, w))


def test_type_parameters_pick_their_instance_on_the_fast_path():
    requires_gpu()
    import kfc

    softmax = kfc.load("kernels/softmax.kfc")
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16):
        x = torch.randn(5, 3000, device="cuda").to(dt)
        for _ in range(2):
            y = softmax(x)
            assert y.dtype == dt
            close(y, torch.softmax(x.float(), -1), 1e-2 if dt != torch.float32 else 1e-5)


def test_every_call_form_takes_the_fast_path(rmsnorm):
    """Keywords, mixed positional and keyword, out= by keyword, a defaulted scalar left out or
    given by keyword: each is the positional call it equals, served by its prepared call."""
    requires_gpu()
    x = torch.randn(9, 1024, device="cuda").to(torch.bfloat16)
    w = torch.randn(1024, device="cuda")
    forms = [lambda y: rmsnorm(x=x, w=w), lambda y: rmsnorm(x, w=w), lambda y: rmsnorm(w=w, x=x),
             lambda y: rmsnorm(x=x, w=w, eps=0.5), lambda y: rmsnorm(x, w, eps=0.5, out=y),
             lambda y: rmsnorm(out=y, w=w, x=x)]
    for form in forms:
        for _ in range(3):
            y = torch.full_like(x, float("nan"))
            got = form(y)
            close(got, rms(x, w, 0.5 if form in forms[3:5] else 1e-6))
    before = prepared(rmsnorm)
    for form in forms:
        form(torch.empty_like(x))
    assert prepared(rmsnorm) == before, "a call form seen before prepares nothing new"
    assert all(plan is not None for plan in rmsnorm._keyword_plans.values())


def test_a_keyword_call_costs_what_a_positional_one_does(rmsnorm):
    requires_gpu()
    import time

    x = torch.randn(1, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, device="cuda")

    def host_us(call):
        for _ in range(500):
            call()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(300):
                call()
            best = min(best, (time.perf_counter() - t0) / 300 * 1e6)
            torch.cuda.synchronize()
        return best

    positional, keyword = host_us(lambda: rmsnorm(x, w)), host_us(lambda: rmsnorm(x=x, w=w))
    print(f"\nkfc rmsnorm 1x256 host time: positional {positional:.2f} us, keyword {keyword:.2f} us")
    assert keyword < positional + 2.0


def test_a_fast_call_costs_little_host_time(rmsnorm):
    """Not the benchmark (bench/launch_overhead.py is), a guard against a slow path sneaking back."""
    requires_gpu()
    import time

    x = torch.randn(1, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, device="cuda")
    for _ in range(500):
        rmsnorm(x, w)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(300):
            rmsnorm(x, w)
        best = min(best, (time.perf_counter() - t0) / 300 * 1e6)
        torch.cuda.synchronize()
    print(f"\nkfc rmsnorm eager call, 1x256: {best:.2f} us of host time")
    assert best < (12 if rmsnorm._native else 25)


def test_concurrent_calls_from_threads_stay_right(rmsnorm):
    """The compiled launcher keeps each call's arguments on its own stack; the ctypes one locks."""
    requires_gpu()
    from concurrent.futures import ThreadPoolExecutor

    g = torch.Generator(device="cuda").manual_seed(3)
    inputs = [(torch.randn(17, 1000 + 8 * k, device="cuda", generator=g).to(torch.bfloat16),
               torch.randn(1000 + 8 * k, device="cuda", generator=g)) for k in range(4)]
    for x, w in inputs:
        rmsnorm(x, w)
    torch.cuda.synchronize()

    def work(k):
        x, w = inputs[k % 4]
        return [(k % 4, rmsnorm(x, w)) for _ in range(50)]

    with ThreadPoolExecutor(8) as pool:
        results = [r for batch in pool.map(work, range(16)) for r in batch]
    torch.cuda.synchronize()
    want = [rms(x, w) for x, w in inputs]
    for k, y in results:
        close(y, want[k])


ADD_B = """
op addb(x: f32[M, N], b: f32[N]?) -> (y: f32[M, N]) {
  parallel m in 0..M {
    y[m, :] = x[m, :] * 2.0 + b
  }
}
"""


def test_an_optional_tensor_left_out_and_given(tmp_path):
    """Leaving an optional tensor out, passing None and passing it are three signatures."""
    requires_gpu()
    import kfc

    path = tmp_path / "addb.kfc"
    path.write_text(ADD_B)
    addb = kfc.load(path)
    x, b = torch.randn(33, 777, device="cuda"), torch.randn(777, device="cuda")
    for _ in range(3):
        close(addb(x, b), x * 2 + b, 1e-6)
        close(addb(x), x * 2, 1e-6)
        close(addb(x, None), x * 2, 1e-6)


def test_dynamic_shared_memory_past_48k_is_allowed(monkeypatch):
    """A contract asking for 100 KB of dynamic shared memory launches (the runtime raises the
    kernel's limit; without that the driver refuses the launch), on both launch paths."""
    requires_gpu()
    import json

    import kfc
    import kfc.runtime.kernel as K

    real = K.cached_compile

    def with_smem(spec, target, pipeline, dims):
        cubin, report = real(spec, target, pipeline, dims)
        report = json.loads(json.dumps(report))
        report["kernels"][0]["smem_dynamic_bytes"] = 100 * 1024
        return cubin, report

    monkeypatch.setattr(K, "cached_compile", with_smem)
    for native in (True, False):
        k = kfc.load("kernels/rmsnorm.kfc")
        if not native:
            k._native = None
        x = torch.randn(5, 3000, device="cuda").to(torch.bfloat16)
        w = torch.randn(3000, device="cuda")
        for _ in range(3):
            close(k(x, w), rms(x, w))


def test_a_kernel_loaded_with_a_knowledge_base_compiles_from_its_nearest_record(tmp_path):
    """kfc.load(path, kb=...): an op the knowledge base never saw takes the most alike op's
    record (kfc.kb.advice), says so, and computes what the default does."""
    requires_gpu()
    import kfc
    from kfc.kb.store import KnowledgeBase
    from tests.test_kb_advice import NEW_OP, TUNED, record

    kb = tmp_path / "kb.sqlite"
    with KnowledgeBase(kb) as k:
        record(k, "rmsnorm", "kernels/rmsnorm.kfc", [({"M": 32768, "N": 4096}, TUNED, 50.0, 1.2, 1.15)])
    path = tmp_path / "scaled_rms.kfc"
    path.write_text(NEW_OP)
    advised, default = kfc.load(path, kb=str(kb)), kfc.load(path)
    x = torch.randn(300, 4096, device="cuda").to(torch.bfloat16)
    w = torch.randn(4096, device="cuda")
    close(advised(x, w), default(x, w), 1e-2)
    (advice,) = advised.advised.values()
    assert advice.pipeline == TUNED and advice.op_name == "rmsnorm" and not default.advised
