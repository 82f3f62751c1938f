"""Kimi Delta Attention (KDA) forward as the plain per-token recurrence.

This is the correctness oracle for the chunked KDA kernel, so it favours being
obviously right over being fast: one token at a time, in float64 by default.
Per sequence and head, with state S in R^{K x V}:

    S   <- S * exp(g_t)[:, None]        per-channel decay, g_t in log space
    u_t  = v_t - S^T k_t                delta-rule residual against the decayed state
    S   <- S + beta_t k_t u_t^T
    o_t  = S^T (scale * q_t)

Layouts follow flash-linear-attention: either packed variable length
(batch 1 plus ``cu_seqlens``) or fixed length (batch B, ``cu_seqlens=None``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["kda_recurrent", "kda_flashkda", "kda_fla_gated", "kda_prepare_flashkda", "kda_prepare_fla",
           "kda_recurrence"]

L2NORM_EPS = 1e-6  # fla's and FlashKDA's in-kernel q/k normalisation: x / sqrt(sum(x^2) + eps)


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    h0: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    acc_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the KDA recurrence token by token.

    Args:
        q, k: [B, T, H, K]. v: [B, T, H, V]. g: [B, T, H, K] log-space decay.
            beta: [B, T, H]. Any floating dtype; all upcast to ``acc_dtype``.
        cu_seqlens: int32/int64 [N+1] sequence boundaries into the T axis
            (then B must be 1), or None for B independent fixed-length rows.
        h0: initial states [N, H, K, V] (or [B, H, K, V]); None means zeros.
        scale: query scale; None means K ** -0.5.
        acc_dtype: floating dtype all arithmetic is done in.

    Returns:
        (o, ht): o [B, T, H, V] float32, ht [N or B, H, K, V] float32.
    """
    B, T, H, K, V = _check_shapes(q, k, v, g, beta)
    if not acc_dtype.is_floating_point:
        raise ValueError(f"acc_dtype must be a floating dtype, got {acc_dtype}")
    device = q.device
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("h0", h0)):
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")

    bounds = _check_cu_seqlens(cu_seqlens, B, T)
    N = B if bounds is None else len(bounds) - 1
    if h0 is not None:
        if not h0.is_floating_point():
            raise ValueError(f"h0 must be floating point, got {h0.dtype}")
        if tuple(h0.shape) != (N, H, K, V):
            raise ValueError(f"h0 must have shape {(N, H, K, V)} (sequences, H, K, V), got {tuple(h0.shape)}")
    if scale is None:
        scale = K**-0.5

    # Upcast once up front so every step below is pure acc_dtype arithmetic.
    q = q.to(acc_dtype) * scale
    k, v, g, beta = (t.to(acc_dtype) for t in (k, v, g, beta))
    decay = g.exp()
    S = (
        h0.to(acc_dtype).clone()
        if h0 is not None
        else torch.zeros(N, H, K, V, dtype=acc_dtype, device=device)
    )
    o = torch.empty(B, T, H, V, dtype=acc_dtype, device=device)

    if bounds is None:
        # Fixed length: the B rows are independent, so step them together.
        _recur(q, k, v, decay, beta, S, o)
    else:
        for n, (bos, eos) in enumerate(zip(bounds[:-1], bounds[1:])):
            sl = slice(bos, eos)
            # S[n : n + 1] is a view, so the recurrence updates S in place.
            _recur(q[:, sl], k[:, sl], v[:, sl], decay[:, sl], beta[:, sl], S[n : n + 1], o[:, sl])
    return o.float(), S.float()


def kda_flashkda(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, h0=None, scale=None, lower_bound=-5.0):
    """FlashKDA's forward interface on the recurrence (float64): raw gates `g` [1, T, H, K]
    activated as lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h])), q and k L2-normalised
    along K, beta given as logits, states V-first ([N, H, V, K]). Returns (o, ht), ht V-first."""
    f = torch.float64
    gate = _flashkda_gate(g, A_log, dt_bias, lower_bound)

    state = None if h0 is None else h0.to(f).transpose(-1, -2)
    o, ht = kda_recurrent(_l2norm(q), _l2norm(k), v, gate, torch.sigmoid(beta.to(f)), cu_seqlens, state, scale)
    return o, ht.transpose(-1, -2).contiguous()


def kda_fla_gated(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, h0=None, scale=None, gate_form=1,
                  lower_bound=-5.0, qk_l2norm=1, beta_logits=0, beta_max=1.0):
    """fla's chunk_kda forward in full, on the recurrence (float64). `gate_form` 0: `g` [1, T, HV, K]
    is the log-space gate; 1: raw gates activated as -exp(A_log[h]) * softplus(g + dt_bias[h])
    (use_gate_in_kernel, unbounded below); 2: as lower_bound * sigmoid(exp(A_log[h]) * (g +
    dt_bias[h])) (with safe_gate). `qk_l2norm`: q and k L2-normalised along K. `beta_logits`:
    beta activated as beta_max * sigmoid(beta), else taken as probabilities. A_log and dt_bias
    absent read as zeros, as the kernel reads them. States [N, HV, K, V]; with HV value heads a
    multiple of q's and k's H, value head h reads q/k head h // (HV / H). Returns (o, ht)."""
    gate, b = _fla_gate(g, A_log, dt_bias, gate_form, lower_bound), _fla_beta(beta, beta_logits, beta_max)
    q, k = _fla_qk(q, k, v.shape[2], qk_l2norm)
    return kda_recurrent(q, k, v, gate, b, cu_seqlens, h0, scale)


def kda_prepare_flashkda(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, scale=None, lower_bound=-5.0, *, C):
    """The state-independent work of each chunk of C tokens (kernels/kda_prepare_flashkda.kfc),
    in float64. Inputs as kda_flashkda's. With G the chunk's cumulative gate, Akk and Aqk its
    decayed key-key and query-key products and Ainv = (I + diag(beta) strict(Akk))^-1, returns per
    token row: w = Ainv diag(beta) (k e^G), u = Ainv diag(beta) v, qg = q e^G (q scaled),
    kg = k e^(Gend - G), aqk = causal Aqk [.., C] and gend = e^Gend on the chunk's first row (its
    other rows are not written: NaN here, as the check poisons them)."""
    gate = _flashkda_gate(g, A_log, dt_bias, lower_bound)
    return _prepare(_l2norm(q), _l2norm(k), v, gate, torch.sigmoid(beta.to(torch.float64)), cu_seqlens, scale, C)


def kda_prepare_fla(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, scale=None, gate_form=1, lower_bound=-5.0,
                    qk_l2norm=1, beta_logits=0, beta_max=1.0, *, C, DECAY=1):
    """kda_prepare_flashkda's outputs (kernels/kda_prepare_fla.kfc) for fla's interface, in float64:
    the inputs and options as kda_fla_gated's, the outputs [1, T, HV, ...] per value head. Each
    gate floored as the kernel floors it: at -100 (DECAY = 1), at -80 / C (DECAY = 2, its decays factorised)."""
    floor = -80.0 / C if int(DECAY) == 2 else -100.0
    gate = _fla_gate(g, A_log, dt_bias, gate_form, lower_bound).clamp(min=floor)
    b = _fla_beta(beta, beta_logits, beta_max)
    q, k = _fla_qk(q, k, v.shape[2], qk_l2norm)
    return _prepare(q, k, v, gate, b, cu_seqlens, scale, C)


def _prepare(q, k, v, gate, beta, cu_seqlens, scale, C):
    """The prepare kernels' outputs from q and k as the kernel normalises them (unscaled), v, the
    log-space gate and beta as probabilities, all [1, T, H, ...]."""
    f = torch.float64
    _, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    qn, kn, vf, b, gate = q.to(f)[0] * scale, k.to(f)[0], v.to(f)[0], beta.to(f)[0], gate.to(f)[0]
    bounds = [int(x) for x in cu_seqlens.tolist()]
    out = {n: torch.zeros(T, H, d, dtype=f, device=q.device)
           for n, d in (("w", K), ("u", V), ("qg", K), ("kg", K), ("aqk", C))}
    out["gend"] = torch.full((T, H, K), math.nan, dtype=f, device=q.device)
    for a, e in ((t, min(t + C, end)) for bos, end in zip(bounds, bounds[1:]) for t in range(bos, end, C)):
        G = gate[a:e].cumsum(0).transpose(0, 1)                     # [H, L, K]
        kc, qc, vc, bc = (x[a:e].transpose(0, 1) for x in (kn, qn, vf, b))   # [H, L, ...], bc [H, L]
        decay = (G[:, :, None, :] - G[:, None, :, :]).clamp(max=0.0).exp()   # [H, L, L, K]; j > i masked below
        L = e - a
        strict, causal = (torch.ones(L, L, dtype=torch.bool, device=q.device).tril(d) for d in (-1, 0))
        Akk = torch.einsum("hik,hjk,hijk->hij", kc, kc, decay) * strict
        Aqk = torch.einsum("hik,hjk,hijk->hij", qc, kc, decay) * causal
        Ainv = torch.linalg.inv(torch.eye(L, dtype=f, device=q.device) + bc[:, :, None] * Akk)
        Gend = G[:, -1, :]                                           # [H, K]
        put = {"w": Ainv @ (bc[:, :, None] * kc * G.exp()), "u": Ainv @ (bc[:, :, None] * vc),
               "qg": qc * G.exp(), "kg": kc * (Gend[:, None, :] - G).exp(),
               "gend": Gend.exp()[:, None, :]}
        for n, x in put.items():
            out[n][a:a + x.shape[1]] = x.transpose(0, 1)
        out["aqk"][a:e, :, :L] = Aqk.transpose(0, 1)
    return tuple(out[n][None].float() for n in ("w", "u", "qg", "kg", "aqk", "gend"))


def kda_recurrence(w, u, qg, kg, aqk, gend, cu_seqlens, h0=None):
    """The state carried across each sequence's chunks (kernels/kda_recurrence.kfc), in float64:
    per chunk of C = aqk's last dim tokens from the sequence's start, U = u - w S,
    o = qg S + aqk U, S = gend[first row] * S + kg^T U. States V-first, [N, H, V, K]."""
    f = torch.float64
    _, T, H, K = w.shape
    V, C = u.shape[-1], aqk.shape[-1]
    w, u, qg, kg, aqk, gend = (x.to(f)[0] for x in (w, u, qg, kg, aqk, gend))
    bounds = [int(x) for x in cu_seqlens.tolist()]
    N = len(bounds) - 1
    S = torch.zeros(N, H, K, V, dtype=f, device=w.device) if h0 is None else h0.to(f).transpose(-1, -2).clone()
    o = torch.zeros(T, H, V, dtype=f, device=w.device)
    for n in range(N):
        for t in range(bounds[n], bounds[n + 1], C):
            e = min(t + C, bounds[n + 1])
            rows = lambda x: x[t:e].transpose(0, 1)                  # noqa: E731 - [H, L, ...]
            U = rows(u) - rows(w) @ S[n]
            o[t:e] = (rows(qg) @ S[n] + rows(aqk)[:, :, : e - t] @ U).transpose(0, 1)
            S[n] = gend[t][:, :, None] * S[n] + rows(kg).transpose(1, 2) @ U
    return o[None].float(), S.transpose(-1, -2).contiguous().float()


def _fla_gate(g, A_log, dt_bias, gate_form, lower_bound):
    """fla's log-space gate, in float64: g as given (gate_form 0), -exp(A_log[h]) * softplus(g +
    dt_bias[h]) (1), or lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h])) (2); A_log and
    dt_bias absent read as zeros, as the kernels read them."""
    f = torch.float64
    HV, K = g.shape[-2:]
    A_log = torch.zeros(HV, dtype=f, device=g.device) if A_log is None else A_log.to(f)
    z = g.to(f) + (0.0 if dt_bias is None else dt_bias.to(f).reshape(HV, K)[None, None])
    rate = A_log.exp()[None, None, :, None]
    if int(gate_form) == 0:
        return g.to(f)
    return -rate * torch.nn.functional.softplus(z) if int(gate_form) == 1 else lower_bound * torch.sigmoid(rate * z)


def _fla_beta(beta, beta_logits, beta_max):
    """beta as probabilities, in float64: beta_max * sigmoid(beta) where given as logits."""
    return beta_max * torch.sigmoid(beta.to(torch.float64)) if beta_logits else beta.to(torch.float64)


def _fla_qk(q, k, HV, qk_l2norm):
    """q and k for each of the HV value heads (value head h reads q/k head h // (HV / H)),
    L2-normalised where asked, in float64."""
    group = HV // q.shape[2]
    q, k = (x.to(torch.float64).repeat_interleave(group, dim=2) for x in (q, k))
    return (_l2norm(q), _l2norm(k)) if qk_l2norm else (q, k)


def _flashkda_gate(g, A_log, dt_bias, lower_bound):
    """FlashKDA's log-space gate from its raw values, in float64:
    lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))."""
    f = torch.float64
    return lower_bound * torch.sigmoid(A_log.to(f).exp()[None, None, :, None] * (g.to(f) + dt_bias.to(f)[None, None]))


def _l2norm(x):
    """x / sqrt(sum(x^2) + eps) along the last dim, in float64."""
    x = x.to(torch.float64)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _recur(q, k, v, decay, beta, S, o) -> None:
    """Step the recurrence over axis 1, vectorised over batch and heads.

    q, k, decay: [b, t, H, K]; v: [b, t, H, V]; beta: [b, t, H];
    S: [b, H, K, V], updated in place; o: [b, t, H, V], written in place.
    q is already scaled.
    """
    for t in range(q.shape[1]):
        k_t = k[:, t]
        S.mul_(decay[:, t].unsqueeze(-1))
        # S^T k_t as a [.., 1, K] @ [.., K, V] row-vector product.
        u = v[:, t] - (k_t.unsqueeze(-2) @ S).squeeze(-2)
        S.add_(k_t.unsqueeze(-1) * (beta[:, t].unsqueeze(-1) * u).unsqueeze(-2))
        o[:, t] = (q[:, t].unsqueeze(-2) @ S).squeeze(-2)


def _check_shapes(q, k, v, g, beta) -> tuple[int, int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if g.shape != q.shape:
        raise ValueError(f"g must have q's shape {tuple(q.shape)}, got {tuple(g.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] = [{B}, {T}, {H}, V], got {tuple(v.shape)}")
    if tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    return B, T, H, K, v.shape[3]


def _check_cu_seqlens(cu_seqlens, B: int, T: int) -> list[int] | None:
    """Return the sequence boundaries as python ints, or None for fixed length."""
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be an int tensor or None, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
    if B != 1:
        raise ValueError(f"with cu_seqlens the inputs must be packed with batch size 1, got B={B}")
    # One host sync: the boundaries drive python-level loops anyway.
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {bounds[0]}")
    if bounds[-1] != T:
        raise ValueError(f"cu_seqlens must end at T={T}, got {bounds[-1]}")
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b < a:
            raise ValueError(f"cu_seqlens must be nondecreasing, but cu_seqlens[{n + 1}]={b} < cu_seqlens[{n}]={a}")
    return bounds
