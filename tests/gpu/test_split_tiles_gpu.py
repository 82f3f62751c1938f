"""Ops over rank-2 tiles on the H200, against torch on fresh random inputs with NaN-poisoned
outputs, at odd sizes: examples/headscale.kfc (a norm per token and head over a token's [H, D]
tile, split into rows by split-tiles) and examples/head_sums.kfc (reductions over the heads, a
loop over them inside each token's iteration), and examples/chunked_cumsum.kfc (two parallel
loops, two kernels). Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.example_ops import OPS  # noqa: E402

pytestmark = pytest.mark.gpu


def load_example(tmp_path, name):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    import kfc

    path = tmp_path / f"{name}.kfc"
    path.write_text(OPS[name])
    return kfc.load(path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("s, h, d", [(1, 1, 7), (7, 3, 128), (257, 8, 64), (33, 5, 4095), (3, 64, 64)])
def test_a_norm_over_a_tokens_heads(tmp_path, dtype, s, h, d):
    op = load_example(tmp_path, "headscale")
    x = torch.randn(s, h, d, device="cuda").to(dtype)
    w, g = torch.randn(d, device="cuda"), torch.randn(s, h, device="cuda")
    y = torch.full_like(x, float("nan"))
    op(x, w, g, out=y)
    xd = x.double()
    want = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double() * g.double()[:, :, None]
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    err = float(((y.double() - want).abs() / (want.abs() + want.abs().mean())).max())
    assert torch.isfinite(y.float()).all() and err < tol, err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("s, h, d", [(1, 1, 7), (7, 3, 128), (257, 17, 1000), (33, 64, 4095)])
def test_statistics_over_a_tokens_heads(tmp_path, dtype, s, h, d):
    """examples/head_sums.kfc: sums, a mean and a maximum over each token's heads (a loop over
    the heads inside the token's iteration), and the heads written out scaled on the way."""
    op = load_example(tmp_path, "head_sums")
    x = torch.randn(s, h, d, device="cuda").to(dtype)
    w = torch.randn(d, device="cuda")
    y = torch.full((s, d), float("nan"), device="cuda")
    z = torch.full_like(x, float("nan"))
    op(x, w, out=(y, z))
    xd = x.double()
    want = xd.pow(2).sum(1) * w.double() + xd.mean(1) - xd.amax(1)
    err = float(((y.double() - want).abs() / (want.abs() + want.abs().mean())).max())
    assert torch.isfinite(y).all() and err < 1e-5, err
    assert torch.equal(z, (x.float() * 2).to(dtype))


@pytest.mark.parametrize("b, nc, c, d", [(1, 1, 4, 7), (2, 13, 16, 8), (3, 200, 64, 128), (1, 1000, 16, 33)])
def test_a_running_sum_over_chunks_as_two_kernels(tmp_path, b, nc, c, d):
    """examples/chunked_cumsum.kfc: two parallel loops, two kernels launched in order; the
    second reads every earlier chunk's total that the first stored in a scratch tensor."""
    op = load_example(tmp_path, "chunked_cumsum")
    x = torch.randn(b, nc, c, d, device="cuda")
    y = torch.full_like(x, float("nan"))
    op(x, out=y)
    want = x.double().flatten(1, 2).cumsum(1).reshape(x.shape)
    err = float(((y.double() - want).abs() / (want.abs() + want.abs().mean())).max())
    assert torch.isfinite(y).all() and err < 1e-5, err
    assert torch.equal(op(x=x), y)  # by keyword, the output and the scratch tensor allocated
