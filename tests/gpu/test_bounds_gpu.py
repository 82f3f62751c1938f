"""One-element loads and stores stay inside their tensors on the H200: a loss over a vocabulary
reads x[m, label[m]] in CTAs of several rows, with M not a multiple of them (this read past the
tensor before such loads were predicated), and labels outside the vocabulary read nothing.
Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.vocabulary_loss import XENT  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def xent(tmp_path_factory):
    import kfc

    path = tmp_path_factory.mktemp("xent") / "xent.kfc"
    path.write_text(XENT)
    return kfc.load(path)


@pytest.mark.parametrize("m,n", [(1, 1000), (7, 1000), (9, 1000), (257, 4095), (33, 128256), (5, 256000)])
def test_a_vocabulary_loss_reads_only_its_rows(xent, m, n):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    label = torch.randint(0, n, (m,), device="cuda", generator=g, dtype=torch.int32)
    loss = torch.full((m,), float("nan"), device="cuda")
    xent(x, label, out=loss)
    torch.cuda.synchronize()
    want = torch.logsumexp(x.float(), -1) - x.float().gather(1, label.long()[:, None])[:, 0]
    assert torch.isfinite(loss).all()
    assert float((loss - want).abs().max()) < 2e-2


def test_labels_outside_the_vocabulary_read_nothing(xent):
    x = torch.randn(9, 1000, device="cuda").to(torch.bfloat16)
    label = torch.tensor([0, 999, 1000, -1, 2**31 - 1, -(2**31), 5, 1000000, 3], device="cuda", dtype=torch.int32)
    loss = xent(x, label)
    torch.cuda.synchronize()  # an out-of-bounds read would fault here
    lse = torch.logsumexp(x.float(), -1)
    ok = (label >= 0) & (label < 1000)
    want = lse - x.float().gather(1, label.clamp(0, 999).long()[:, None])[:, 0]
    assert float((loss[ok] - want[ok]).abs().max()) < 2e-2
    assert torch.isfinite(loss).all()
