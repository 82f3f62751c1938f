"""Scans along a row (examples/scans.kfc, examples/suffix_scans.kfc) on the H200, against torch
on fresh random inputs with NaN-poisoned (or -1-poisoned, for integers) outputs: f32 sums, i32
exclusive counts and running maxima, forwards and from the row's end, at rows of one to 16384
elements (a warp segment, several warps, rows packed several to a warp), and rows of 32768 to
262147 read in chunks. Run with
`pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.example_ops import OPS  # noqa: E402

pytestmark = pytest.mark.gpu
# past 16384 the default pipeline reads the row in chunks of 4096 (chunk-rows)
NS = [1, 7, 32, 1000, 4095, 4096, 16384, 32768, 131072, 262147]


def scanned(tmp_path, name, x):
    """The op's three outputs for rows x, into poisoned outputs."""
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    import kfc

    path = tmp_path / f"{name}.kfc"
    path.write_text(OPS[name])
    m, n = x.shape
    y = torch.full((m, n), float("nan"), device="cuda")
    c = torch.full((m, n), -1, device="cuda", dtype=torch.int32)
    mx = torch.full((m, n), float("nan"), device="cuda")
    kfc.load(path)(x, out=(y, c, mx))
    return y, c, mx


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", NS)
def test_scans_match_torch(tmp_path, dtype, n):
    for m in (1, 7, 257):
        x = torch.randn(m, n, device="cuda").to(dtype)
        y, c, mx = scanned(tmp_path, "scans", x)
        xd = x.double()
        # a prefix sum's rounding grows with its length: compare against the sum of magnitudes
        scale = torch.cumsum(xd.abs(), -1)
        assert torch.isfinite(y).all(), f"{m}x{n}: cumsum unwritten"
        assert float(((y.double() - torch.cumsum(xd, -1)).abs() / (scale + 1e-30)).max()) < 1e-5, f"{m}x{n}: cumsum"
        pos = (x.float() > 0).int()
        assert torch.equal(c, torch.cumsum(pos, -1, dtype=torch.int32) - pos), f"{m}x{n}: exclusive count"
        assert torch.equal(mx, torch.cummax(x.float(), -1).values), f"{m}x{n}: running maximum"


@pytest.mark.parametrize("n", NS)
def test_suffix_scans_match_torch(tmp_path, n):
    def flip(t):
        return torch.flip(t, [-1])

    for m in (1, 7, 257):
        x = torch.randn(m, n, device="cuda")
        y, c, mx = scanned(tmp_path, "suffix_scans", x)
        want = flip(torch.cumsum(flip(x.double().exp()), -1))
        assert torch.isfinite(y).all() and float(((y.double() - want).abs() / want).max()) < 1e-5, f"{m}x{n}: sums"
        pos = (x > 0).int()
        assert torch.equal(c, flip(torch.cumsum(flip(pos), -1, dtype=torch.int32)) - pos), f"{m}x{n}: counts"
        assert torch.equal(mx, flip(torch.cummax(flip(x), -1).values)), f"{m}x{n}: running maximum"
