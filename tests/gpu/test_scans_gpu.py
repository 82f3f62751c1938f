"""Scans along a row (examples/scans.kfc) on the H200, against torch on fresh random inputs
with NaN-poisoned (or -1-poisoned, for integers) outputs: an f32 cumsum, an exclusive i32
count, a running maximum, at rows of one to 16384 elements (a warp segment, several warps,
rows packed several to a warp). Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.example_ops import OPS  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, 7, 32, 1000, 4095, 4096, 16384])
def test_scans_match_torch(tmp_path, dtype, n):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    import kfc

    path = tmp_path / "scans.kfc"
    path.write_text(OPS["scans"])
    op = kfc.load(path)
    for m in (1, 7, 257):
        x = torch.randn(m, n, device="cuda").to(dtype)
        y = torch.full((m, n), float("nan"), device="cuda")
        c = torch.full((m, n), -1, device="cuda", dtype=torch.int32)
        mx = torch.full((m, n), float("nan"), device="cuda")
        op(x, out=(y, c, mx))
        xd = x.double()
        want = torch.cumsum(xd, -1)
        # a prefix sum's rounding grows with its length: compare against the sum of magnitudes
        scale = torch.cumsum(xd.abs(), -1)
        assert torch.isfinite(y).all(), f"{m}x{n}: cumsum unwritten"
        assert float(((y.double() - want).abs() / (scale + 1e-30)).max()) < 1e-5, f"{m}x{n}: cumsum"
        pos = (x.float() > 0).int()
        assert torch.equal(c, torch.cumsum(pos, -1, dtype=torch.int32) - pos), f"{m}x{n}: exclusive count"
        assert torch.equal(mx, torch.cummax(x.float(), -1).values), f"{m}x{n}: running maximum"
