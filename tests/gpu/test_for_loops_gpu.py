"""Row kernels with sequential `for` loops (examples/) on the H200, against torch on
fresh random inputs with NaN-poisoned outputs, at odd sizes: rows read in chunks with a carried
sum, rmsnorm in two passes over chunks, a row folded onto one chunk (a carried tile), and
segments whose bounds are loaded. Run with `pytest -m gpu`."""

import pytest

torch = pytest.importorskip("torch")

from tests.example_ops import OPS  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TOL = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-5}
MS = [1, 7, 257]
NS = [1, 7, 1000, 4095, 4096, 65537]


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


def load(tmp_path, name):
    import kfc

    path = tmp_path / f"{name}.kfc"
    path.write_text(OPS[name])
    return kfc.load(path)


def close(got, want, tol, what):
    o, r = got.double(), want.double()
    assert torch.isfinite(o).all(), f"{what}: {int((~torch.isfinite(o)).sum())} unwritten or non-finite"
    rms = r.pow(2).mean().sqrt() + 1e-30
    rel = float((o - r).pow(2).mean().sqrt() / rms)
    worst = float(((o - r).abs() / (r.abs() + rms)).max())
    assert rel <= tol and worst <= tol, f"{what}: rel RMSE {rel:.3g}, worst {worst:.3g}"


def check_rows(tmp_path, name, dtype, n, out_shape, want, tol, weight=False):
    """The op on fresh rows x (and a weight) at every M, into a NaN-poisoned output of
    out_shape(m), against want(x in float64, w)."""
    requires_gpu()
    op = load(tmp_path, name)
    for m in MS:
        x = torch.randn(m, n, device="cuda").to(DTYPES[dtype])
        w = torch.randn(n, device="cuda")
        y = torch.full(out_shape(m), float("nan"), device="cuda", dtype=x.dtype if out_shape(m) == x.shape else None)
        op(x, w, out=y) if weight else op(x, out=y)
        close(y, want(x.double(), w.double()), tol, f"{name} {dtype} {m}x{n}")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("n", NS)
def test_a_row_summed_in_chunks(tmp_path, dtype, n):
    check_rows(tmp_path, "rowsum_chunked", dtype, n, lambda m: (m,), lambda x, w: x.sum(-1), 1e-5)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("n", NS)
def test_rmsnorm_in_two_passes_over_chunks(tmp_path, dtype, n):
    check_rows(tmp_path, "rmsnorm_chunked", dtype, n, lambda m: (m, n),
               lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, TOL[dtype], weight=True)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("n", NS)
def test_a_row_folded_onto_a_carried_chunk(tmp_path, dtype, n):
    check_rows(tmp_path, "fold", dtype, n, lambda m: (m, 512),
               lambda x, w: torch.nn.functional.pad(x, (0, (-n) % 512)).reshape(x.shape[0], -1, 512).sum(1), 1e-5)


@pytest.mark.parametrize("segments, total", [(1, 1), (3, 1000), (6, 300), (257, 65537), (5, 3)])
def test_segments_with_loaded_bounds(tmp_path, segments, total):
    requires_gpu()
    op = load(tmp_path, "segsum")
    gen = torch.Generator().manual_seed(segments * 7919 + total)
    cuts = torch.sort(torch.randint(0, total + 1, (segments - 1,), generator=gen)).values
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([total])]).to(torch.int32).cuda()
    x = torch.randn(total, device="cuda")
    y = torch.full((segments,), float("nan"), device="cuda")
    op(x, cu, out=y)
    c = cu.tolist()
    want = torch.stack([x[c[i]:c[i + 1]].double().sum() for i in range(segments)])
    close(y, want, 1e-5, f"segsum {segments} segments of {total}")


@pytest.mark.parametrize("n", NS)
def test_chunk_sums_capped_by_an_if_in_the_loop(tmp_path, n):
    requires_gpu()
    op = load(tmp_path, "clipped_sum")
    for m in MS:
        x = torch.randn(m, n, device="cuda") + 0.05
        y = torch.full((m,), float("nan"), device="cuda")
        op(x, 2.0, out=y)
        chunks = torch.nn.functional.pad(x.double(), (0, (-n) % 256)).reshape(m, -1, 256).sum(-1)
        close(y, chunks.clamp(max=2.0).sum(-1), 1e-5, f"clipped_sum {m}x{n}")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("n", NS + [16384])
def test_the_largest_group_sum_by_a_loop_inside_a_loop(tmp_path, dtype, n):
    def want(x, w):
        groups = torch.nn.functional.pad(x, (0, (-n) % 4096)).reshape(x.shape[0], -1, 4096).sum(-1)
        return groups.amax(-1)
    check_rows(tmp_path, "group_max_sum", dtype, n, lambda m: (m,), want, 1e-5)


def test_a_persistent_row_loop_over_a_synchronising_for_loop(tmp_path):
    """Each CTA runs many rows, each a loop of CTA reductions: the barrier after the loop keeps
    the next row from writing reduction slots a slow warp still reads."""
    import kfc
    from kfc.passes import ROW_PIPELINE
    from tests.test_for_loops import SYNCED_IN_LOOP

    requires_gpu()
    path = tmp_path / "capped.kfc"
    path.write_text(SYNCED_IN_LOOP)
    op = kfc.load(path, pipeline=ROW_PIPELINE.replace("tile", "tile{persistent=true}", 1))
    for m, n in ((4099, 65536), (257, 24576), (1, 8192)):
        x = torch.randn(m, n, device="cuda")
        y = torch.full((m,), float("nan"), device="cuda")
        op(x, out=y)
        close(y, x.double().sum(-1), 1e-5, f"capped {m}x{n}")
