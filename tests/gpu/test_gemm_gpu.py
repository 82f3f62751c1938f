"""kernels/gemm.kfc (TMA + wgmma) on the GPU: c = a · b in bf16 against a.float() @ b.float() on
fresh random inputs, outputs poisoned with NaN before the call; two calls give bit-identical
results and leave the inputs unchanged; a row pitch TMA cannot take (not a multiple of 16
bytes) is refused with a KfcError. Every dim is fixed per compile, so each shape compiles its
own kernel. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

# (M, N, K): every row pitch (K * 2 bytes for a, N * 2 for b and c) a multiple of 16 bytes;
# M=33 and 4095 leave a partial tile of rows, N=72 and 4104 a partial tile of columns
SHAPES = [(1, 8, 8), (33, 72, 24), (4095, 4104, 136), (128, 256, 64), (256, 512, 192), (4096, 4096, 4096)]
TOL = 1e-2  # bf16 outputs: max |err| / max |ref|

_kernel = []


def gemm():
    import kfc

    if not _kernel:
        _kernel.append(kfc.load("kernels/gemm.kfc"))
    return _kernel[0]


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


def inputs(m, n, k):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(m * 1_000_003 + n * 1009 + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    return a, b


def poisoned(m, n):
    return torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("m,n,k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_gemm_matches_torch(m, n, k):
    requires_gpu()
    g = gemm()
    a, b = inputs(m, n, k)
    a0, b0 = a.clone(), b.clone()
    out = poisoned(m, n)
    got = g(a, b, out=out)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    o = got.float()
    assert torch.isfinite(o).all(), f"gemm {m}x{n}x{k}: {int((~torch.isfinite(o)).sum())} unwritten or non-finite"
    ref = a.float() @ b.float()
    err = float((o - ref).abs().max() / ref.abs().max())
    assert err < TOL, f"gemm {m}x{n}x{k}: max |err| / max |ref| = {err:.3g}"
    assert torch.equal(a, a0) and torch.equal(b, b0), "gemm modified an input"

    again = g(a, b, out=poisoned(m, n))
    fresh = g(a, b)  # the kernel's own output allocation
    torch.cuda.synchronize()
    assert torch.equal(again, got), f"gemm {m}x{n}x{k}: a second call differs"
    assert torch.equal(fresh, got), f"gemm {m}x{n}x{k}: a call without out= differs"
    assert torch.equal(a, a0) and torch.equal(b, b0), "gemm modified an input"


def test_gemm_refuses_a_row_pitch_tma_cannot_take():
    """(M, N, K) = (1, 7, 5): rows of 10 and 14 bytes, not multiples of 16."""
    requires_gpu()
    from kfc.diagnostics import KfcError

    a, b = inputs(1, 7, 5)
    with pytest.raises(KfcError) as e:
        gemm()(a, b)
    assert str(e.value).strip(), "the refusal says nothing"


@pytest.mark.parametrize("m,n,k", [(33, 72, 24), (4095, 4104, 136), (512, 512, 1024)])
def test_gemm_bias_relu_is_one_kernel_and_matches_torch(m, n, k):
    """kernels/gemm_bias_relu.kfc: the bias and the ReLU run on the accumulator in the GEMM's kernel."""
    requires_gpu()
    import kfc

    g = kfc.load("kernels/gemm_bias_relu.kfc")
    a, b = inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.float32)
    got = g(a, b, bias, out=poisoned(m, n))
    torch.cuda.synchronize()
    ref = torch.relu(a.float() @ b.float() + bias)
    o = got.float()
    assert torch.isfinite(o).all()
    err = float((o - ref).abs().max() / ref.abs().max())
    assert err < TOL, f"gemm_bias_relu {m}x{n}x{k}: max |err| / max |ref| = {err:.3g}"
    _, report = g.kernel_for({"M": m, "N": n, "K": k}, 0)
    assert len(report["kernels"]) == 1
