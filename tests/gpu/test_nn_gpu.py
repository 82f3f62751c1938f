"""kfc.nn on the GPU: the drop-in modules and functional forms against torch's, forward and
backward (fp32 gradients on odd shapes), with outputs' memory poisoned first; the custom ops
through torch.library.opcheck; torch.compile(fullgraph=True) and CUDA-graph capture; and a
small transformer block trained for 20 steps under torch.compile with kfc.nn.RMSNorm, its
losses against torch.nn.RMSNorm's. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

SHAPES = [(1, 7), (7, 4095), (257, 4096), (3, 5, 64), (2, 33, 1000)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-5}


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


def poison(*shapes_like):
    """Fill freed memory of the outputs' sizes with NaN, so an output the kernel leaves
    unwritten (the caching allocator hands the same block back) shows as NaN."""
    for t in shapes_like:
        junk = torch.full((t.numel() * 2 + 64,), float("nan"), device="cuda", dtype=torch.float32)
        del junk


def close(got, want, tol):
    got, want = got.float(), want.float()
    assert got.shape == want.shape
    assert torch.isfinite(got).all(), "non-finite values (unwritten output?)"
    rel = float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))
    assert rel <= tol, rel


@pytest.fixture(autouse=True)
def gpu():
    requires_gpu()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wdtype", ["f32", "input"])
def test_rmsnorm_module_forward(shape, dtype, wdtype):
    import kfc.nn

    n = shape[-1]
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    x = torch.randn(*shape, device="cuda", generator=g).to(dtype)
    ours = kfc.nn.RMSNorm(n, eps=1e-6, device="cuda", dtype=torch.float32 if wdtype == "f32" else dtype)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(n, device="cuda", generator=g))
    ref = torch.nn.RMSNorm(n, eps=1e-6, device="cuda", dtype=torch.float64)
    ref.load_state_dict(ours.state_dict())
    poison(x)
    with torch.no_grad():
        y = ours(x)
        assert y.dtype == dtype and y.shape == x.shape
        close(y, ref(x.double()), TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_module_forward(shape, dtype, bias):
    import kfc.nn

    n = shape[-1]
    g = torch.Generator(device="cuda").manual_seed(7 + sum(shape))
    x = (torch.randn(*shape, device="cuda", generator=g) + 0.5).to(dtype)
    ours = kfc.nn.LayerNorm(n, bias=bias, device="cuda")
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(n, device="cuda", generator=g))
    ref = torch.nn.LayerNorm(n, bias=bias, device="cuda", dtype=torch.float64)
    ref.load_state_dict(ours.state_dict())
    poison(x)
    with torch.no_grad():
        y = ours(x)
        close(y, ref(x.double()), TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_forward(shape, dtype, dim):
    import kfc.nn.functional as KF

    x = (torch.randn(*shape, device="cuda") * 3).to(dtype)
    poison(x)
    close(KF.softmax(x, dim=dim), torch.softmax(x.double(), dim=dim), TOL[dtype])


GRAD_SHAPES = [(1, 7), (7, 4095), (33, 1000), (2, 3, 64), (3, 65537)]


def grads(fn, *tensors):
    for t in tensors:
        if t is not None:
            t.grad = None
    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator(device="cuda").manual_seed(5)
    loss = sum((o.float() * torch.randn(o.shape, device="cuda", generator=g)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [None if t is None else t.grad.detach().clone() for t in tensors]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


@pytest.mark.parametrize("shape", GRAD_SHAPES)
def test_rmsnorm_gradients(shape):
    import kfc.nn.functional as KF

    n = shape[-1]
    x0, w0 = torch.randn(*shape, device="cuda"), torch.randn(n, device="cuda")
    x, w = leaf(x0), leaf(w0)
    outs, (dx, dw) = grads(lambda: KF.rms_norm(x, (n,), w, 1e-6), x, w)
    xr, wr = leaf(x0), leaf(w0)
    routs, (rdx, rdw) = grads(lambda: torch.nn.functional.rms_norm(xr, (n,), wr, 1e-6), xr, wr)
    close(outs[0], routs[0], 1e-5)
    close(dx, rdx, 1e-4)
    close(dw, rdw, 1e-4)


@pytest.mark.parametrize("shape", GRAD_SHAPES)
def test_rmsnorm_residual_forward_and_gradients(shape):
    import kfc.nn

    n = shape[-1]
    x0, r0 = torch.randn(*shape, device="cuda"), torch.randn(*shape, device="cuda")
    ours = kfc.nn.RMSNorm(n, eps=1e-6, device="cuda")
    with torch.no_grad():
        ours.weight.copy_(torch.randn(n, device="cuda"))
    ref = torch.nn.RMSNorm(n, eps=1e-6, device="cuda")
    ref.load_state_dict(ours.state_dict())
    x, r = leaf(x0), leaf(r0)
    (y, res_out), (dx, dr) = grads(lambda: ours(x, r), x, r)
    dw = ours.weight.grad
    xr, rr = leaf(x0), leaf(r0)

    def reference():
        h = xr + rr
        return ref(h), h
    (ry, rres), (rdx, rdr) = grads(reference, xr, rr)
    close(y, ry, 1e-5)
    close(res_out, rres, 1e-6)
    close(dx, rdx, 1e-4)
    close(dr, rdr, 1e-4)
    close(dw, ref.weight.grad, 1e-4)


@pytest.mark.parametrize("shape", GRAD_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_gradients(shape, bias):
    import kfc.nn.functional as KF

    n = shape[-1]
    x0 = torch.randn(*shape, device="cuda") + 0.3
    w0, b0 = torch.randn(n, device="cuda"), torch.randn(n, device="cuda") if bias else None
    x, w, b = leaf(x0), leaf(w0), leaf(b0) if bias else None
    outs, got = grads(lambda: KF.layer_norm(x, (n,), w, b, 1e-5), x, w, b)
    xr, wr, br = leaf(x0), leaf(w0), leaf(b0) if bias else None
    routs, want = grads(lambda: torch.nn.functional.layer_norm(xr, (n,), wr, br, 1e-5), xr, wr, br)
    close(outs[0], routs[0], 1e-5)
    for a, b_ in zip(got, want):
        if b_ is not None:
            close(a, b_, 1e-4)


@pytest.mark.parametrize("shape", GRAD_SHAPES)
def test_softmax_gradients(shape):
    import kfc.nn.functional as KF

    x0 = torch.randn(*shape, device="cuda") * 2
    x = leaf(x0)
    outs, (dx,) = grads(lambda: KF.softmax(x, -1), x)
    xr = leaf(x0)
    routs, (rdx,) = grads(lambda: torch.softmax(xr, -1), xr)
    close(outs[0], routs[0], 1e-5)
    close(dx, rdx, 1e-4)


def test_bf16_gradients_stay_close():
    import kfc.nn

    x0 = torch.randn(64, 2048, device="cuda").to(torch.bfloat16)
    ours = kfc.nn.RMSNorm(2048, eps=1e-6, device="cuda")
    x = leaf(x0)
    _, (dx,) = grads(lambda: ours(x), x)
    xr = leaf(x0.float())
    _, (rdx,) = grads(lambda: torch.nn.functional.rms_norm(xr, (2048,), torch.ones(2048, device="cuda"), 1e-6), xr)
    assert dx.dtype == torch.bfloat16
    close(dx, rdx, 2e-2)


@pytest.mark.parametrize("op,args", [
    ("rms_norm", lambda: (torch.randn(5, 300, device="cuda"), torch.randn(300, device="cuda"), 1e-6)),
    ("rms_norm_residual", lambda: (torch.randn(5, 300, device="cuda"), torch.randn(5, 300, device="cuda"),
                                   torch.randn(300, device="cuda"), 1e-6)),
    ("layer_norm", lambda: (torch.randn(5, 300, device="cuda"), torch.randn(300, device="cuda"),
                            torch.randn(300, device="cuda"), 1e-5)),
    ("softmax_lastdim", lambda: (torch.randn(5, 300, device="cuda"),)),
])
def test_opcheck(op, args):
    """torch's own checks of a custom op: schema, fake, autograd registration, AOT dispatch."""
    import kfc.nn  # noqa: F401 - registers the ops

    a = tuple(t.requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in args())
    torch.library.opcheck(getattr(torch.ops.kfc, op).default, a)


def test_compile_fullgraph_and_cuda_graphs():
    import kfc.nn

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = kfc.nn.RMSNorm(512, eps=1e-6)
            self.ln = kfc.nn.LayerNorm(512)
            self.proj = torch.nn.Linear(512, 512)

        def forward(self, x):
            h = self.proj(self.norm(x))
            return kfc.nn.functional.softmax(self.ln(h), dim=-1)

    block = Block().cuda()
    x = torch.randn(4, 33, 512, device="cuda")
    with torch.no_grad():
        want = block(x)
    compiled = torch.compile(block, fullgraph=True)
    with torch.no_grad():
        close(compiled(x), want, 1e-5)
    x2 = torch.randn(4, 65, 512, device="cuda")  # a new shape: a recompile, still one graph
    with torch.no_grad():
        close(compiled(x2), block(x2), 1e-5)
    # capture the eager block in a CUDA graph and replay it on new data
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            block(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = block(static_x)
    static_x.copy_(x2[:, :33])
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        close(static_y, block(x2[:, :33].contiguous()), 1e-5)


def test_a_transformer_block_trains_under_compile_like_torchs():
    """20 steps of AdamW on a small pre-norm transformer block, torch.compile(fullgraph=True),
    kfc.nn.RMSNorm against torch.nn.RMSNorm from the same initial weights and batches."""
    import kfc.nn

    def block(norm_cls):
        torch.manual_seed(0)

        class Block(torch.nn.Module):
            def __init__(self, d=256, heads=4):
                super().__init__()
                self.n1, self.n2 = norm_cls(d, eps=1e-6), norm_cls(d, eps=1e-6)
                self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
                self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
                self.head = torch.nn.Linear(d, 1)

            def forward(self, x):
                h = self.n1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
                x = x + self.mlp(self.n2(x))
                return self.head(x).squeeze(-1)

        return Block().cuda()

    def train(norm_cls):
        model = block(norm_cls)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        step = torch.compile(model, fullgraph=True)
        g = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(20):
            x = torch.randn(8, 64, 256, device="cuda", generator=g)
            target = torch.randn(8, 64, device="cuda", generator=g)
            loss = torch.nn.functional.mse_loss(step(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses

    import torch._dynamo

    from kfc.library import kernel

    torch._dynamo.reset()
    ours = train(kfc.nn.RMSNorm)
    for name in ("rmsnorm", "rmsnorm_bwd_dx"):  # kfc's kernels ran inside the compiled graph
        k = kernel(name)
        assert k._launchers or k._fast, f"{name} never ran"
    theirs = train(torch.nn.RMSNorm)
    print("\nlosses kfc  :", " ".join(f"{v:.4f}" for v in ours))
    print("losses torch:", " ".join(f"{v:.4f}" for v in theirs))
    assert ours[-1] < ours[0], "the loss went down"
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-2 * abs(b), (a, b)
