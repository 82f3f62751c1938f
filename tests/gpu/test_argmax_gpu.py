"""iota of a bound dim in a row program on the H200: the first index of each row's maximum
(tests/argmax_op.py), against torch, for rows in registers and staged, odd shapes included.
Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.argmax_op import ARGMAX  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def argmax(tmp_path_factory):
    import kfc

    path = tmp_path_factory.mktemp("argmax") / "argmax.kfc"
    path.write_text(ARGMAX)
    return kfc.load(path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n", [(1, 7), (7, 1000), (257, 4095), (33, 65536), (5, 262144), (3, 65537)])
def test_argmax_by_iota_matches_torch(argmax, m, n, dtype):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    g = torch.Generator(device="cuda").manual_seed(m * n)
    x = torch.randn(m, n, device="cuda", generator=g).to(dtype)
    x[0, n // 2] = 100.0  # a clear maximum in the middle of the first row
    index = torch.full((m,), -7, device="cuda", dtype=torch.int32)
    argmax(x, out=index)
    torch.cuda.synchronize()
    want = torch.argmax(x.float(), dim=-1)  # the first maximum, as ties resolve in kfc's op
    assert torch.equal(index.long(), want), (index[:8], want[:8])
    assert int(index[0]) == n // 2
