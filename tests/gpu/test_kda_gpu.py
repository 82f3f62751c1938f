"""KDA forward on the GPU (the shared-memory tile kernel of kfc.codegen.tile_emitter) against the
fp64 per-token recurrence (kfc.reference.kda), for every chunk size the op offers: uneven
sequences, an empty one, resets of -1e5 among slow decays, the initial state given and absent,
head dims 32 to 128, outputs poisoned. Run with `pytest -m gpu`."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kfc.check.runner import compare  # noqa: E402
from kfc.frontend import load_kfc  # noqa: E402
from kfc.model.target import parse_target  # noqa: E402
from kfc.reference.kda import kda_recurrent  # noqa: E402
from kfc.runtime.kernel import KfcKernel  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 5e-3  # kda_fwd.kfc's, for bf16 and f32 outputs
# (sequence lengths, heads, K, V)
CASES = [([200], 2, 32, 32), ([37, 0, 200, 64], 2, 32, 24), ([130, 300], 2, 64, 64), ([300, 77], 2, 128, 128)]


def kda_instance(chunk: int):
    return load_kfc(ROOT / "kernels" / "kda_fwd.kfc", {"C": str(chunk)})


def inputs(lengths, H, K, V, with_state: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    unit = lambda *s: torch.nn.functional.normalize(torch.randn(*s, generator=g), dim=-1)
    q, k = unit(1, T, H, K).bfloat16(), unit(1, T, H, K).bfloat16()
    v = torch.randn(1, T, H, V, generator=g).bfloat16()
    gate = torch.nn.functional.logsigmoid(torch.randn(1, T, H, K, generator=g) - 3.0)
    gate[torch.rand(1, T, H, K, generator=g) < 0.02] = -1e5  # resets: exp(-1e5) = 0 wipes what it decays
    beta = torch.sigmoid(torch.randn(1, T, H, generator=g)).bfloat16()
    cu = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32)
    h0 = torch.randn(len(lengths), H, K, V, generator=g) if with_state else None
    return q, k, v, gate, beta, cu, h0


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_kda_on_the_gpu_matches_the_fp64_recurrence(chunk):
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")
    kernel = KfcKernel(kda_instance(chunk), parse_target("sm_90a"))
    checked = 0
    for ci, (lengths, H, K, V) in enumerate(CASES):
        for with_state in (True, False):
            q, k, v, g, beta, cu, h0 = inputs(lengths, H, K, V, with_state, seed=100 * ci + with_state)
            want_o, want_ht = kda_recurrent(q.double(), k.double(), v.double(), g.double(), beta.double(), cu.long(),
                                            None if h0 is None else h0.double())
            T, N = sum(lengths), len(lengths)
            o = torch.full((1, T, H, V), float("nan"), dtype=torch.bfloat16, device="cuda")
            ht = torch.full((N, H, K, V), float("nan"), dtype=torch.float32, device="cuda")
            given = dict(q=q.cuda(), k=k.cuda(), v=v.cuda(), g=g.cuda(), beta=beta.cuda(), cu_seqlens=cu.cuda())
            if h0 is not None:
                given["h0"] = h0.cuda()
            kernel(**given, out=(o, ht))
            torch.cuda.synchronize()
            for name, got, ref in (("o", o, want_o), ("ht", ht, want_ht)):
                _, rel, ok, note = compare(got.float().cpu().numpy(), ref.float().numpy(), TOLERANCE)
                assert ok, f"C={chunk} case {ci} (lengths {lengths}, H={H}, K={K}, V={V}, state={with_state}): " \
                           f"{name}: {note or f'relative RMSE {rel:.3g}'}"
            checked += 1
    assert checked == 2 * len(CASES)
