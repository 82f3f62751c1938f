"""Rows read in chunks on the H200, against torch on fresh random inputs with poisoned outputs:
the first index where a row's running sum passes a threshold (an arg-reduction over a scan,
examples/first_crossing.kfc) and i32 row reductions (examples/positives.kfc), at rows a CTA
holds whole and rows of up to 262147 elements. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.example_ops import OPS  # noqa: E402

pytestmark = pytest.mark.gpu
NS = [7, 1000, 4096, 32768, 131072, 262147]

def load(tmp_path, name, text):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    import kfc

    path = tmp_path / f"{name}.kfc"
    path.write_text(text)
    return kfc.load(path)


@pytest.mark.parametrize("n", NS)
def test_first_crossing_matches_torch(tmp_path, n):
    op = load(tmp_path, "first_crossing", OPS["first_crossing"])
    for m in (1, 7, 129):
        x = torch.randn(m, n, device="cuda") + 0.001  # a slight drift: most rows cross
        t = float(n) ** 0.5
        at = torch.full((m,), -7, device="cuda", dtype=torch.int32)
        total = torch.full((m,), float("nan"), device="cuda")
        op(x, t, out=(at, total))
        run = torch.cumsum(x.double(), -1)
        above = run > t
        want = torch.where(above.any(-1), above.int().argmax(-1), torch.full_like(above[:, 0], n, dtype=torch.long))
        # rows whose running sum passes t by less than the rounding of a long f32 sum may differ
        close = ((run - t).abs() < 1e-4 * torch.cumsum(x.double().abs(), -1)).any(-1)
        assert torch.equal(at.long()[~close], want[~close]), f"{m}x{n}: {at[:4]} vs {want[:4]}"
        assert float(((total.double() - x.double().sum(-1)).abs() / x.double().abs().sum(-1)).max()) < 1e-5


@pytest.mark.parametrize("n", NS)
def test_integer_row_reductions_are_exact(tmp_path, n):
    op = load(tmp_path, "positives", OPS["positives"])
    for m in (1, 7, 257):
        x = torch.randn(m, n, device="cuda")
        count = torch.full((m,), -7, device="cuda", dtype=torch.int32)
        top = torch.full((m,), -7, device="cuda", dtype=torch.int32)
        op(x, out=(count, top))
        p = (x > 0).int()
        assert torch.equal(count, p.sum(-1).int()), f"{m}x{n}: counts"
        want = (p * torch.arange(n, device="cuda", dtype=torch.int32)).max(-1).values
        assert torch.equal(top, want), f"{m}x{n}: last positive"
