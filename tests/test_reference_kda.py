"""Tests for the plain-torch KDA recurrence oracle (kfc.reference.kda)."""

import math

import pytest
import torch
import torch.nn.functional as F

from kfc.reference.kda import kda_recurrent


def make_inputs(B, T, H, K, V, *, seed, n_states=None, dtype=torch.float32):
    """Random KDA inputs in the ranges the real model produces."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = F.normalize(randn(B, T, H, K), dim=-1)
    k = F.normalize(randn(B, T, H, K), dim=-1)
    v = randn(B, T, H, V)
    g = F.logsigmoid(randn(B, T, H, K))
    beta = torch.sigmoid(randn(B, T, H))
    h0 = randn(B if n_states is None else n_states, H, K, V)
    return tuple(t.to(dtype) for t in (q, k, v, g, beta)) + (h0,)


def test_zero_decay_and_beta_leaves_state_fixed():
    # g = 0 means decay 1 and beta = 0 means no write, so o_t = h0^T (scale q_t).
    q, k, v, _, _, h0 = make_inputs(1, 10, 3, 8, 6, seed=0, n_states=2)
    g = torch.zeros_like(q)
    beta = torch.zeros(q.shape[:3])
    cu = torch.tensor([0, 4, 10])
    scale = 0.37

    o, ht = kda_recurrent(q, k, v, g, beta, cu, h0, scale)

    seq_of_token = torch.tensor([0] * 4 + [1] * 6)
    expected = torch.einsum("thk,thkv->thv", q[0].double() * scale, h0.double()[seq_of_token])
    torch.testing.assert_close(o[0], expected.float(), rtol=1e-6, atol=1e-6)
    # S * 1 + 0 * (...) is exact, so the state comes back bit for bit.
    assert torch.equal(ht, h0)


def test_tiny_case_against_scalar_loops():
    K = V = 2
    T = 2
    q, k, v, g, beta, h0 = make_inputs(1, T, 1, K, V, seed=1)
    scale = K**-0.5

    # Independent oracle: plain python floats and explicit index loops.
    S = [[h0[0, 0, i, j].item() for j in range(V)] for i in range(K)]
    want_o = []
    for t in range(T):
        qt = [q[0, t, 0, i].item() * scale for i in range(K)]
        kt = [k[0, t, 0, i].item() for i in range(K)]
        vt = [v[0, t, 0, j].item() for j in range(V)]
        gt = [g[0, t, 0, i].item() for i in range(K)]
        bt = beta[0, t, 0].item()
        S = [[S[i][j] * math.exp(gt[i]) for j in range(V)] for i in range(K)]
        u = [vt[j] - sum(S[i][j] * kt[i] for i in range(K)) for j in range(V)]
        S = [[S[i][j] + bt * kt[i] * u[j] for j in range(V)] for i in range(K)]
        want_o.append([sum(S[i][j] * qt[i] for i in range(K)) for j in range(V)])

    o, ht = kda_recurrent(q, k, v, g, beta, torch.tensor([0, T]), h0)

    assert o.shape == (1, T, 1, V) and o.dtype == torch.float32
    assert ht.shape == (1, 1, K, V) and ht.dtype == torch.float32
    torch.testing.assert_close(o[0, :, 0], torch.tensor(want_o), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ht[0, 0], torch.tensor(S), rtol=1e-6, atol=1e-6)


def test_varlen_matches_separate_sequences():
    q, k, v, g, beta, h0 = make_inputs(1, 12, 3, 8, 6, seed=2, n_states=2)
    o, ht = kda_recurrent(q, k, v, g, beta, torch.tensor([0, 5, 12]), h0)

    for n, sl in enumerate((slice(0, 5), slice(5, 12))):
        o_n, ht_n = kda_recurrent(
            q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], None, h0[n : n + 1]
        )
        torch.testing.assert_close(o[:, sl], o_n, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ht[n : n + 1], ht_n, rtol=1e-6, atol=1e-6)


def test_fixed_length_batch_matches_packed():
    B, T = 3, 6
    q, k, v, g, beta, h0 = make_inputs(B, T, 2, 8, 4, seed=3)
    o, ht = kda_recurrent(q, k, v, g, beta, None, h0)

    def pack(x):
        return x.reshape(1, B * T, *x.shape[2:])

    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)
    o_p, ht_p = kda_recurrent(*map(pack, (q, k, v, g, beta)), cu, h0)
    assert o.shape == (B, T, 2, 4) and ht.shape == (B, 2, 8, 4)
    torch.testing.assert_close(pack(o), o_p, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ht, ht_p, rtol=1e-6, atol=1e-6)


def test_empty_sequence_keeps_initial_state():
    q, k, v, g, beta, h0 = make_inputs(1, 7, 2, 4, 4, seed=4, n_states=3)
    cu = torch.tensor([0, 3, 3, 7])
    _, ht = kda_recurrent(q, k, v, g, beta, cu, h0)
    assert torch.equal(ht[1], h0[1])
    _, ht_zero = kda_recurrent(q, k, v, g, beta, cu)
    assert torch.equal(ht_zero[1], torch.zeros_like(h0[1]))
    assert ht_zero[0].abs().sum() > 0


def test_split_sequence_matches_one_call():
    q, k, v, g, beta, h0 = make_inputs(1, 20, 3, 8, 6, seed=5)
    o, ht = kda_recurrent(q, k, v, g, beta, torch.tensor([0, 20]), h0)

    a, b = slice(0, 9), slice(9, 20)
    o_a, ht_a = kda_recurrent(q[:, a], k[:, a], v[:, a], g[:, a], beta[:, a], torch.tensor([0, 9]), h0)
    o_b, ht_b = kda_recurrent(q[:, b], k[:, b], v[:, b], g[:, b], beta[:, b], torch.tensor([0, 11]), ht_a)

    # ht_a is rounded to float32 between the calls, hence not bitwise.
    torch.testing.assert_close(torch.cat([o_a, o_b], dim=1), o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ht_b, ht, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_are_upcast(dtype):
    q, k, v, g, beta, h0 = make_inputs(1, 9, 2, 8, 8, seed=6, n_states=2, dtype=dtype)
    cu64 = torch.tensor([0, 4, 9])
    o, ht = kda_recurrent(q, k, v, g, beta, cu64.int(), h0)
    assert o.dtype == ht.dtype == torch.float32
    # Same values given as float32 must give the same answer: only the math dtype matters.
    o32, ht32 = kda_recurrent(q.float(), k.float(), v.float(), g.float(), beta.float(), cu64, h0)
    assert torch.equal(o, o32) and torch.equal(ht, ht32)


def test_float32_accumulation_is_close_to_float64():
    q, k, v, g, beta, h0 = make_inputs(1, 64, 2, 16, 16, seed=7)
    cu = torch.tensor([0, 64])
    o64, ht64 = kda_recurrent(q, k, v, g, beta, cu, h0)
    o32, ht32 = kda_recurrent(q, k, v, g, beta, cu, h0, acc_dtype=torch.float32)
    torch.testing.assert_close(o32, o64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ht32, ht64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "cu, match",
    [
        ([1, 5, 12], "must start at 0"),
        ([0, 5, 11], "must end at T=12"),
        ([0, 7, 5, 12], "nondecreasing"),
        ([0], "at least 2 entries"),
    ],
)
def test_bad_cu_seqlens_values(cu, match):
    q, k, v, g, beta, _ = make_inputs(1, 12, 2, 4, 4, seed=8)
    with pytest.raises(ValueError, match=match):
        kda_recurrent(q, k, v, g, beta, torch.tensor(cu))


def test_bad_cu_seqlens_kind():
    q, k, v, g, beta, _ = make_inputs(1, 12, 2, 4, 4, seed=9)
    with pytest.raises(ValueError, match="int32 or int64"):
        kda_recurrent(q, k, v, g, beta, torch.tensor([0.0, 12.0]))
    with pytest.raises(ValueError, match="1-D"):
        kda_recurrent(q, k, v, g, beta, torch.tensor([[0, 12]]))
    with pytest.raises(ValueError, match="int tensor or None"):
        kda_recurrent(q, k, v, g, beta, [0, 12])

    q2, k2, v2, g2, beta2, _ = make_inputs(2, 6, 2, 4, 4, seed=10)
    with pytest.raises(ValueError, match="batch size 1, got B=2"):
        kda_recurrent(q2, k2, v2, g2, beta2, torch.tensor([0, 6]))


def test_bad_shapes():
    q, k, v, g, beta, h0 = make_inputs(1, 12, 2, 4, 4, seed=11, n_states=2)
    cu = torch.tensor([0, 5, 12])
    with pytest.raises(ValueError, match="k must have q's shape"):
        kda_recurrent(q, k[..., :3], v, g, beta, cu)
    with pytest.raises(ValueError, match="g must have q's shape"):
        kda_recurrent(q, k, v, g[:, :11], beta, cu)
    with pytest.raises(ValueError, match="v must be"):
        kda_recurrent(q, k, v[:, :, :1], g, beta, cu)
    with pytest.raises(ValueError, match="beta must be"):
        kda_recurrent(q, k, v, g, beta[..., None], cu)
    with pytest.raises(ValueError, match=r"h0 must have shape \(2, 2, 4, 4\)"):
        kda_recurrent(q, k, v, g, beta, cu, h0[:1])


def test_flashkdas_interface_is_the_recurrence_on_its_activated_inputs_token_by_token():
    """kda_flashkda against a direct loop written from FlashKDA's documentation: the gate
    lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h])), q and k divided by sqrt(|x|^2 + 1e-6),
    beta = sigmoid(logits), the state held V-first and updated in that layout."""
    from kfc.reference.kda import kda_flashkda

    gen = torch.Generator().manual_seed(3)
    T, H, K, V, lb, scale = 7, 2, 4, 3, -5.0, 0.5
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v, g = torch.randn(1, T, H, V, generator=gen), torch.randn(1, T, H, K, generator=gen)
    beta, a_log = torch.randn(1, T, H, generator=gen), torch.randn(H, generator=gen)
    dt_bias, h0 = torch.randn(H, K, generator=gen), torch.randn(2, H, V, K, generator=gen)
    cu = torch.tensor([0, 3, T])
    o, ht = kda_flashkda(q, k, v, g, beta, a_log, dt_bias, cu, h0, scale, lb)
    for n in range(2):
        for h in range(H):
            S = h0[n, h].double().clone()  # [V, K]
            for t in range(int(cu[n]), int(cu[n + 1])):
                gate = lb * torch.sigmoid(math.exp(a_log[h]) * (g[0, t, h].double() + dt_bias[h].double()))
                qn = q[0, t, h].double() / torch.sqrt((q[0, t, h].double() ** 2).sum() + 1e-6)
                kn = k[0, t, h].double() / torch.sqrt((k[0, t, h].double() ** 2).sum() + 1e-6)
                S = S * torch.exp(gate)[None, :]
                u = v[0, t, h].double() - S @ kn
                S = S + torch.sigmoid(beta[0, t, h].double()) * u[:, None] * kn[None, :]
                torch.testing.assert_close(o[0, t, h].double(), S @ (scale * qn), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ht[n, h].double(), S, rtol=1e-6, atol=1e-6)


def test_flas_gated_interface_is_the_recurrence_on_its_activated_inputs_token_by_token():
    """kda_fla_gated against a direct loop written from fla's documentation of chunk_kda with
    the gate and the q/k norm in the kernel: the gate -exp(A_log[h]) * log(1 + exp(g + dt_bias[h])),
    q and k divided by sqrt(|x|^2 + 1e-6), beta as given, the state [K, V]."""
    from kfc.reference.kda import kda_fla_gated

    gen = torch.Generator().manual_seed(4)
    T, H, K, V, scale = 7, 2, 4, 3, 0.5
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v, g = torch.randn(1, T, H, V, generator=gen), torch.randn(1, T, H, K, generator=gen)
    beta, a_log = torch.rand(1, T, H, generator=gen), torch.rand(H, generator=gen) * 2.77
    dt_bias, h0 = torch.randn(H * K, generator=gen), torch.randn(2, H, K, V, generator=gen)
    cu = torch.tensor([0, 3, T])
    o, ht = kda_fla_gated(q, k, v, g, beta, a_log, dt_bias, cu, h0, scale)
    for n in range(2):
        for h in range(H):
            S = h0[n, h].double().clone()  # [K, V]
            for t in range(int(cu[n]), int(cu[n + 1])):
                x = g[0, t, h].double() + dt_bias.view(H, K)[h].double()
                gate = -math.exp(a_log[h]) * torch.log1p(torch.exp(x))
                qn = q[0, t, h].double() / torch.sqrt((q[0, t, h].double() ** 2).sum() + 1e-6)
                kn = k[0, t, h].double() / torch.sqrt((k[0, t, h].double() ** 2).sum() + 1e-6)
                S = S * torch.exp(gate)[:, None]
                u = v[0, t, h].double() - S.T @ kn
                S = S + beta[0, t, h].double() * kn[:, None] * u[None, :]
                torch.testing.assert_close(o[0, t, h].double(), S.T @ (scale * qn), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ht[n, h].double(), S, rtol=1e-6, atol=1e-6)
