"""Ops named after C++ keywords, CUDA built-ins and kfc's own generated names compute what their
plainly named twins compute (tests/hostile_names.py), on fresh random inputs with NaN-poisoned
outputs, for odd shapes. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from hostile_names import NEUTRAL, cases, reference, source  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_names_compute_the_right_result(case):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    from kfc.frontend import parse_kfc
    from kfc.runtime.kernel import KfcKernel

    cid, names = case
    nm = {**NEUTRAL, **names}
    k = KfcKernel(parse_kfc(source(cid, names), f"<{cid}>"))
    gen = torch.Generator(device="cuda")
    for m, n in [(1, 7), (7, 8), (257, 4095)]:
        gen.manual_seed(m * 100003 + n)
        inputs = {nm["x"]: torch.randn(m, n, device="cuda", generator=gen)}
        if cid == "norm":
            inputs[nm["g"]] = torch.randn(n, device="cuda", generator=gen)
        out = torch.full((m, n), float("nan"), device="cuda")
        got = k(**inputs, out=out)
        torch.cuda.synchronize()
        ref = reference(cid, inputs, names)
        assert torch.isfinite(got).all(), f"{cid} {m}x{n}: unwritten elements"
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
