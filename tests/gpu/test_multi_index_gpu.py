"""Ops over several parallel indices (linearised into rows) on the H200: a norm per (token,
head) and a scale per (batch, token, head), against torch on fresh inputs with NaN-poisoned
outputs, at odd sizes. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.multi_index_ops import BTH, HEADNORM  # noqa: E402

pytestmark = pytest.mark.gpu


def load(tmp_path, name, text):
    import kfc

    path = tmp_path / f"{name}.kfc"
    path.write_text(text)
    return kfc.load(path)


@pytest.mark.parametrize("t,h,d", [(1, 1, 7), (7, 3, 128), (257, 8, 64), (33, 5, 4095)])
def test_a_norm_per_token_and_head(tmp_path, t, h, d):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    op = load(tmp_path, "headnorm", HEADNORM)
    q, w = torch.randn(t, h, d, device="cuda"), torch.randn(d, device="cuda")
    y = torch.full_like(q, float("nan"))
    for _ in range(2):  # the full path, then the fast one
        op(q, w, out=y)
        want = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        assert torch.isfinite(y).all() and float((y - want).abs().max()) < 1e-4


@pytest.mark.parametrize("b,s,h,d", [(1, 1, 1, 3), (2, 7, 3, 64), (3, 33, 5, 100)])
def test_a_scale_per_batch_token_and_head(tmp_path, b, s, h, d):
    op = load(tmp_path, "bth", BTH)
    x = torch.randn(b, s, h, d, device="cuda").to(torch.bfloat16)
    sc = torch.randn(h, device="cuda")
    y = torch.full_like(x, float("nan"))
    op(x, sc, out=y)
    want = (x.float() * sc[:, None]).to(torch.bfloat16)
    assert torch.isfinite(y.float()).all() and float((y.float() - want.float()).abs().max()) < 2e-2
