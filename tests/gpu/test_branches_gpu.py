"""Row kernels with an `if` (examples/) on the H200, against torch on fresh random
inputs with poisoned outputs, at odd sizes: rows whose norm passes a limit clipped (both
branches in one launch, several rows a CTA), and rows centred where a switch says so (a
reduction inside the branch: one row a CTA). Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.example_ops import OPS  # noqa: E402

pytestmark = pytest.mark.gpu


def load(tmp_path, name):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    import kfc

    path = tmp_path / f"{name}.kfc"
    path.write_text(OPS[name])
    return kfc.load(path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, 7, 1000, 4096, 65537])
def test_rows_clipped_where_their_norm_passes_the_limit(tmp_path, dtype, n):
    op = load(tmp_path, "clipnorm")
    for m in (1, 7, 257):
        # row scales spread the norms on both sides of the limit
        x = (torch.randn(m, n, device="cuda") * torch.logspace(-2, 2, m, device="cuda")[:, None]).to(dtype)
        # between the rows' norms (at one, f32 and f64 norms may fall either side of it)
        limit = float(x.float().norm(dim=-1).median()) * 1.37
        y = torch.full_like(x, float("nan"))
        flag = torch.full((m,), -1, device="cuda", dtype=torch.int32)
        op(x, limit, out=(y, flag))
        nrm = x.double().norm(dim=-1, keepdim=True)
        want = x.double() * torch.where(nrm > limit, limit / nrm, torch.ones_like(nrm))
        assert torch.equal(flag, (nrm.squeeze(-1) > limit).int()), f"{m}x{n}: flags"
        err = float(((y.double() - want).abs() / (want.abs() + want.abs().mean() + 1e-30)).max())
        assert torch.isfinite(y.float()).all() and err < (1e-2 if dtype == torch.bfloat16 else 1e-5), f"{m}x{n}: {err}"


@pytest.mark.parametrize("n", [1, 7, 1000, 4096, 65536, 262147])  # the last two flattened, in a cluster
def test_rows_centred_where_their_switch_is_on(tmp_path, n):
    op = load(tmp_path, "maybe_center")
    for m in (1, 7, 257):
        x = torch.randn(m, n, device="cuda")
        on = torch.randint(0, 2, (m,), device="cuda", dtype=torch.int32)
        y = torch.full_like(x, float("nan"))
        op(x, on, out=y)
        want = torch.where(on[:, None] != 0, x - x.mean(-1, keepdim=True), x)
        assert torch.isfinite(y).all() and float((y - want).abs().max()) < 1e-5, f"{m}x{n}"


TILE_BRANCH = """
op flip_negative(x: f32[B, 16, D]) -> (y: f32[B, 16, D]) {
  parallel b in 0..B {
    t = x[b, :, :]
    if sum(t) < 0.0 {
      t = 0.0 - t
    }
    y[b, :, :] = t
  }
}
"""


@pytest.mark.parametrize("d", [1, 7, 40])
def test_a_branch_on_a_whole_tile_takes_one_side_per_cta(tmp_path, d):
    """The tile emitter's `if`: the whole CTA takes one side (a barrier on each)."""
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    import kfc

    path = tmp_path / "flip_negative.kfc"
    path.write_text(TILE_BRANCH)
    op = kfc.load(path)
    x = torch.randn(9, 16, d, device="cuda")
    x[::2] += 0.5   # both sides taken in one launch, and no sum near 0
    x[1::2] -= 0.5
    y = torch.full_like(x, float("nan"))
    op(x, out=y)
    want = torch.where(x.sum((1, 2), keepdim=True) < 0, -x, x)
    assert torch.equal(y, want)
