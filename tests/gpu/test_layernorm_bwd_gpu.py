"""layernorm's backward pass on the GPU: dx and the weight and bias gradients dw and db (sums
across rows, in two kernels through a workspace) against autograd of torch's layer_norm with the
mean and 1/std of the forward, in bf16, f16 and f32, NaN-poisoned outputs, at M in
{1, 7, 257, 32768} and rows of 1 to 262144; staged, register and re-read rows; dw and db
bit-identical across repeats. Run with `pytest -m gpu`."""

import pytest

from tests.gpu.test_rmsnorm_bwd_gpu import DTYPES, MAX_ELEMENTS, MS, NS, TOL, cached_kernels, close, requires_gpu

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

PIPELINES = {
    "default": None,
    # every row staged, two rows per CTA, the sums in shared memory
    "staged-rows": "canonicalize,cse,dce,stage-rows{min_bytes=0},tile{rows=2,sums=shared},lower-reductions,fuse-reductions,"
                   "lower-ptx,canonicalize,cse,dce",
    # rows the bulk copy cannot move loaded again in each stretch
    "reread": "canonicalize,cse,dce,stage-rows{reread=true},tile,lower-reductions,fuse-reductions,lower-ptx,canonicalize,"
              "cse,dce",
    # rows in registers, narrow vectors, the sums in registers (two sums of rows of 262144 do not
    # fit there: that pipeline leaves that length out)
    "registers": "canonicalize,cse,dce,tile{vec=2,sums=registers},lower-reductions,lower-ptx,canonicalize,cse,dce",
}
EPS = 1e-5
kernel = cached_kernels("kernels/layernorm_bwd.kfc", PIPELINES)


def inputs(m, n, dtype, gen):
    x = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    w = torch.randn(n, device="cuda", generator=gen)
    dout = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    xd = x.double()
    mean = xd.mean(-1)
    rstd = torch.rsqrt(xd.var(-1, unbiased=False) + EPS)
    return x, w, dout, mean.float(), rstd.float()


def reference(x, w, dout):
    """Autograd of torch's layer_norm, in float64: shares no formula with the kernel."""
    with torch.enable_grad():
        xd = x.double().requires_grad_(True)
        wd = w.double().requires_grad_(True)
        bd = torch.zeros_like(wd).requires_grad_(True)
        y = torch.nn.functional.layer_norm(xd, (x.shape[-1],), wd, bd, EPS)
        return torch.autograd.grad(y, (xd, wd, bd), dout.double())


def closed_form(x, w, dout, mean, rstd):
    """The gradients given the mean and rstd the kernel reads, in float64."""
    rd = rstd.double()[:, None]
    xh, dyd = (x.double() - mean.double()[:, None]) * rd, dout.double()
    g = dyd * w.double()
    dx = rd * (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True))
    return dx, (dyd * xh).sum(0), dyd.sum(0)


# the other pipelines leave out the lengths the default one covers alone (the suite's time)
CASES = [(p, d, n) for p in PIPELINES for d in DTYPES for n in NS
         if p == "default" or (p == "reread" and n in (65537, 262143)) or (p not in ("default", "reread") and n not in (1, 262143)
                                                                            and not (p == "registers" and n == 262144))]


@pytest.mark.parametrize("pipeline,dtype,n", CASES)
def test_layernorm_bwd_matches_autograd(pipeline, dtype, n):
    requires_gpu()
    k = kernel(pipeline)
    gen = torch.Generator(device="cuda")
    for m in MS:
        if m * n > MAX_ELEMENTS // 4:
            continue
        gen.manual_seed(hash((pipeline, dtype, m, n)) % (1 << 31))
        x, w, dout, mean, rstd = inputs(m, n, DTYPES[dtype], gen)
        before = [t.clone() for t in (x, w, dout, mean, rstd)]
        dx = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
        dw = torch.full((n,), float("nan"), device="cuda")
        db = torch.full((n,), float("nan"), device="cuda")
        got = k(x, w, dout, mean, rstd, out=(dx, dw, db))
        torch.cuda.synchronize()
        assert [t.data_ptr() for t in got] == [dx.data_ptr(), dw.data_ptr(), db.data_ptr()]
        what = f"{pipeline} {dtype} {m}x{n}"
        cdx, cdw, cdb = closed_form(x, w, dout, mean, rstd)
        # a row of one: x̂ is 0 and dx cancels to rounding; it is checked against rstd·dout·w
        scale = (rstd.double()[:, None] * dout.double() * w.double()).abs() if n == 1 else None
        close(dx, cdx, TOL[dtype], f"dx {what}", scale)
        # dw and db sum m rows: their rounding grows with m, as every fp32 reduction's does
        # rows of one: x̂ is 0, so dw is 0; it is checked against the size of dout·rstd
        close(dw, cdw, max(TOL[dtype], 1e-4), f"dw {what}",
              (dout.double().abs() * rstd.double()[:, None]).sum(0) if n == 1 else None)
        close(db, cdb, max(TOL[dtype], 1e-4), f"db {what}")
        if n > 1:
            rdx, rdw, rdb = reference(x, w, dout)
            close(dx, rdx, TOL[dtype], f"dx {what} (autograd)")
            close(dw, rdw, max(TOL[dtype], 1e-4), f"dw {what} (autograd)")
            close(db, rdb, max(TOL[dtype], 1e-4), f"db {what} (autograd)")
        for a, b in zip((x, w, dout, mean, rstd), before):
            assert torch.equal(a, b), "the kernel modified an input"


def test_dw_and_db_are_bit_identical_across_calls():
    """The partials are added in a fixed order: repeats agree to the bit (the gate's rule)."""
    requires_gpu()
    k = kernel()
    gen = torch.Generator(device="cuda").manual_seed(3)
    args = inputs(16384, 8192, torch.bfloat16, gen)
    first = k(*args)
    for _ in range(3):
        again = k(*args)
        assert all(torch.equal(a, b) for a, b in zip(again, first))
