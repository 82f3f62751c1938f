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


# --- the torch entry points (kfc.nn.kda) on the GPU --------------------------------------------

ENTRY_CASES = [  # (B, lengths or None, H, HV, K, V, dtype, options, chunk: None for the default, 16)
    (2, None, 2, 4, 128, 128, torch.bfloat16, dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True), None),
    (1, [37, 0, 300, 64], 2, 2, 64, 64, torch.float16, dict(), 32),
    (1, [150, 77], 1, 2, 100, 60, torch.bfloat16,
     dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, use_beta_sigmoid_in_kernel=True,
          allow_neg_eigval=True, state_v_first=True, use_qk_l2norm_in_kernel=True), 64),
    # fla's D = 256: the state over blocks of V's columns (kernels/kda_fwd_fla_split.kfc)
    (1, [300, 77], 1, 2, 256, 256, torch.bfloat16, dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True), None),
    # the chunk 16 in bf16 that split=True runs as the pair (kernels/kda_prepare_fla.kfc): resets, then safe_gate
    (1, [37, 0, 300, 64], 2, 2, 64, 64, torch.bfloat16, dict(), None),
    (1, [150, 77], 1, 2, 128, 128, torch.bfloat16,
     dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, use_beta_sigmoid_in_kernel=True,
          state_v_first=True, use_qk_l2norm_in_kernel=True), None),
]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("case", range(len(ENTRY_CASES)))
def test_chunk_kda_in_flas_interface_on_the_gpu(case, split):
    """kfc.nn.kda.chunk_kda with fla's options: the batch packed, grouped heads, varlen with an
    empty sequence, odd head dims, each gate form, beta logits doubled, V-first bf16 states; o and
    the final state against the fp64 recurrence, an f32 state given. With split=True the bf16
    cases at chunk 16 run the pair (the prepare kernel, then the recurrence), the rest one kernel."""
    from kfc.nn.kda import chunk_kda
    from kfc.reference.kda import kda_fla_gated

    B, lengths, H, HV, K, V, dtype, options, chunk = ENTRY_CASES[case]
    g = torch.Generator().manual_seed(case)
    T = sum(lengths) if lengths else 200
    N = len(lengths) if lengths else B
    q, k = (torch.randn(B, T, H, K, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=g).to(dtype)
    raw = torch.randn(B, T, HV, K, generator=g)
    beta = torch.randn(B, T, HV, generator=g)
    h0 = torch.randn(N, HV, K, V, generator=g)
    A_log, dt_bias = torch.rand(HV, generator=g), torch.randn(HV * K, generator=g)
    gate_in = options.get("use_gate_in_kernel", False)
    gate = raw if gate_in else torch.nn.functional.logsigmoid(raw - 2)
    if not gate_in:
        gate[torch.rand(gate.shape, generator=g) < 0.02] = -1e5  # resets
    if not options.get("use_qk_l2norm_in_kernel"):
        q, k = (torch.nn.functional.normalize(x.float(), dim=-1).to(dtype) for x in (q, k))
    b = beta if options.get("use_beta_sigmoid_in_kernel") else beta.sigmoid()
    cu = None if lengths is None else torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int64)
    v_first = options.get("state_v_first", False)
    state = h0.transpose(-1, -2).contiguous() if v_first else h0
    with torch.no_grad():
        o, ht = chunk_kda(q.cuda(), k.cuda(), v.cuda(), gate.cuda(), b.cuda(), initial_state=state.cuda(),
                          output_final_state=True, A_log=A_log.cuda() if gate_in else None,
                          dt_bias=dt_bias.cuda() if gate_in else None,
                          cu_seqlens=None if cu is None else cu.cuda(), chunk_size=chunk, split=split, **options)
    torch.cuda.synchronize()
    form = 2 if options.get("safe_gate") else 1 if gate_in else 0
    flat = lambda x: x.reshape(1, B * T, *x.shape[2:])  # noqa: E731
    offsets = cu if cu is not None else torch.arange(B + 1) * T
    want_o, want_ht = kda_fla_gated(flat(q), flat(k), flat(v), flat(gate), flat(b), A_log if gate_in else None,
                                    dt_bias if gate_in else None, offsets, h0=h0, gate_form=form,
                                    lower_bound=options.get("lower_bound", -5.0),
                                    qk_l2norm=int(options.get("use_qk_l2norm_in_kernel", False)),
                                    beta_logits=int(options.get("use_beta_sigmoid_in_kernel", False)),
                                    beta_max=2.0 if options.get("allow_neg_eigval") else 1.0)
    got_ht = ht.transpose(-1, -2) if v_first else ht
    for name, got, ref in (("o", flat(o), want_o), ("ht", got_ht, want_ht)):
        _, rel, ok, note = compare(got.float().cpu().numpy(), ref.float().numpy(), TOLERANCE)
        assert ok, f"case {case}: {name}: {note or f'relative RMSE {rel:.3g}'}"


@pytest.mark.parametrize("state", [None, torch.float32, torch.bfloat16])
def test_flash_kda_fwd_in_flashkdas_interface_on_the_gpu(state):
    """kfc.nn.kda.flash_kda_fwd with FlashKDA's arguments: a batch of two (B > 1, no offsets),
    K = V = 128, states V-first in f32 or bf16 or none, out and final_state written in place."""
    from kfc.nn.kda import flash_kda_fwd
    from kfc.reference.kda import kda_flashkda

    g = torch.Generator().manual_seed(7)
    B, T, H, K = 2, 257, 3, 128
    q, k, v, raw = (torch.randn(B, T, H, K, generator=g).bfloat16() for _ in range(4))
    beta = torch.randn(B, T, H, generator=g).bfloat16()
    A_log, dt_bias = torch.rand(H, generator=g), torch.rand(H, K, generator=g)
    h0 = None if state is None else torch.randn(B, H, K, K, generator=g).to(state)
    out = torch.full((B, T, H, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    final = None if state is None else torch.full((B, H, K, K), float("nan"), dtype=state, device="cuda")
    flash_kda_fwd(q.cuda(), k.cuda(), v.cuda(), raw.cuda(), beta.cuda(), K ** -0.5, out, A_log.cuda(), dt_bias.cuda(),
                  -5.0, initial_state=None if h0 is None else h0.cuda(), final_state=final)
    torch.cuda.synchronize()
    flat = lambda x: x.reshape(1, B * T, *x.shape[2:])  # noqa: E731
    want_o, want_ht = kda_flashkda(flat(q), flat(k), flat(v), flat(raw), flat(beta), A_log, dt_bias,
                                   torch.arange(B + 1) * T, h0=None if h0 is None else h0.float())
    pairs = [("out", flat(out), want_o)] + ([] if final is None else [("final_state", final, want_ht)])
    for name, got, ref in pairs:
        _, rel, ok, note = compare(got.float().cpu().numpy(), ref.float().numpy(), TOLERANCE)
        assert ok, f"state {state}: {name}: {note or f'relative RMSE {rel:.3g}'}"


def test_chunk_kda_intermediate_states_on_the_gpu():
    """return_intermediate_states: h[0, i] is the state before each sequence's i-th 64 tokens (the
    fp64 recurrence's final state on that prefix), o and the final state as in one launch."""
    from kfc.nn.kda import chunk_kda

    lengths = [130, 64, 7]
    q, k, v, gate, beta, cu, h0 = inputs(lengths, 2, 64, 64, True, 5)
    dev = [x.cuda() for x in (q, k, v, gate, beta, cu, h0)]
    with torch.no_grad():
        o, ht, h = chunk_kda(*dev[:5], initial_state=dev[6], output_final_state=True, cu_seqlens=dev[5],
                             return_intermediate_states=True)
        o1, ht1 = chunk_kda(*dev[:5], initial_state=dev[6], output_final_state=True, cu_seqlens=dev[5])
    assert h.shape == (1, 3 + 1 + 1, 2, 64, 64) and h.dtype == torch.bfloat16
    for name, got, ref in (("o", o, o1), ("ht", ht, ht1)):
        _, rel, ok, note = compare(got.float().cpu().numpy(), ref.float().cpu().numpy(), TOLERANCE)
        assert ok, f"{name}: {note or f'relative RMSE {rel:.3g}'}"
    want = [h0[0], kda_recurrent(q[:, :64].double(), k[:, :64].double(), v[:, :64].double(), gate[:, :64].double(),
                                 beta[:, :64].double(), None, h0[:1].double())[1][0],
            kda_recurrent(q[:, :128].double(), k[:, :128].double(), v[:, :128].double(), gate[:, :128].double(),
                          beta[:, :128].double(), None, h0[:1].double())[1][0], h0[1], h0[2]]
    for i, ref in enumerate(want):
        _, rel, ok, note = compare(h[0, i].float().cpu().numpy(), ref.float().numpy(), TOLERANCE)
        assert ok, f"h[0, {i}]: {note or f'relative RMSE {rel:.3g}'}"


@pytest.mark.parametrize("lengths", [[257], [37, 0, 200, 64]])
def test_flashkdas_pair_as_one_op_matches_flash_kda_fwd_and_the_fp64_recurrence(lengths):
    """kernels/kda_fwd_flashkda_pair.kfc called through kfc.load: its two kernels and six scratch
    tensors give o and the final state of flash_kda_fwd (the same two kernels from two ops) and of
    the float64 reference, on a varlen batch with an empty sequence."""
    import kfc
    from kfc.nn.kda import flash_kda_fwd
    from kfc.reference.kda import kda_flashkda

    g = torch.Generator().manual_seed(11)
    T, H, K, N = sum(lengths), 3, 128, len(lengths)
    q, k, v, raw = (torch.randn(1, T, H, K, generator=g).bfloat16() for _ in range(4))
    beta = torch.randn(1, T, H, generator=g).bfloat16()
    A_log, dt_bias = torch.rand(H, generator=g), torch.rand(H, K, generator=g)
    h0 = torch.randn(N, H, K, K, generator=g)
    cu = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int64)
    op = kfc.load(str(ROOT / "kernels/kda_fwd_flashkda_pair.kfc"))
    cuda = [x.cuda() for x in (q, k, v, raw, beta, A_log, dt_bias, cu, h0)]
    o = torch.full((1, T, H, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    ht = torch.full((N, H, K, K), float("nan"), device="cuda")
    op(*cuda, out=(o, ht))
    out = torch.full_like(o, float("nan"))
    final = torch.full_like(ht, float("nan"))
    flash_kda_fwd(*cuda[:5], K ** -0.5, out, cuda[5], cuda[6], -5.0, initial_state=cuda[8], final_state=final,
                  cu_seqlens=cuda[7])
    torch.cuda.synchronize()
    want_o, want_ht = kda_flashkda(q, k, v, raw, beta, A_log, dt_bias, cu, h0=h0)
    for name, got, ref, alike in (("o", o, want_o, out), ("ht", ht, want_ht, final)):
        _, rel, ok, note = compare(got.float().cpu().numpy(), ref.float().numpy(), TOLERANCE)
        assert ok, f"{lengths}: {name}: {note or f'relative RMSE {rel:.3g}'}"
        _, rel, ok, note = compare(got.float().cpu().numpy(), alike.float().cpu().numpy(), TOLERANCE)
        assert ok, f"{lengths}: {name} against flash_kda_fwd: {note or f'relative RMSE {rel:.3g}'}"
