"""Kimi Delta Attention's forward from torch, in fla's and FlashKDA's interfaces.

    o, ht = kfc.nn.kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    kfc.nn.kda.flash_kda_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                             initial_state=h0, final_state=ht, cu_seqlens=cu)

chunk_kda takes fla's `chunk_kda` arguments with their meanings and runs kernels/kda_fwd_fla.kfc,
whose run-time switches carry fla's options (the gate given or computed in the kernel, its
lower-bound form, q/k L2 norm, beta as logits), so one compiled kernel serves every call; with
split=True (kfc's own), kernels/kda_prepare_fla.kfc and the recurrence below, where they hold.
flash_kda_fwd takes FlashKDA's `fwd` arguments and writes `out` and `final_state` in place, by
two kernels: kernels/kda_prepare_flashkda.kfc does every chunk's state-independent work for all
(chunk, head) at once into f32 workspaces, then kernels/kda_recurrence.kfc carries the state
across each sequence's chunks (over blocks of V's columns, a CTA each, by
kernels/kda_recurrence_split.kfc, where the (sequence, head) pairs would leave SMs idle: see
recurrence_columns); at chunk 32 or 64, a lower_bound below -5 or with `split=False`, the one
kernel kernels/kda_fwd_flashkda.kfc, a CTA per (sequence, head), does both.

A batch B > 1 without cu_seqlens runs as B packed sequences of T (a view and an offsets tensor).
Inputs the kernels take in one dtype are converted first: g and beta to f32 for chunk_kda (fla's
log-space gates are f32 already; raw bf16 gates convert exactly), cu_seqlens to int64 for
FlashKDA's. `state_v_first` transposes the state on the way in and out (a copy of each).
Forward only: a call whose outputs would need a gradient is refused, not silently detached.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..diagnostics import KfcError
from ..library import kernel
from .kda_states import intermediate_states
from .ops import ready

CHUNKS = (64, 32, 16)  # the chunk sizes the kernels are written for (their type parameter C)
DEFAULT_CHUNK = 16      # FlashKDA's chunk, and the least shared memory per CTA of the three
FLA_CHUNKS = (32, 64)   # the chunk sizes fla's chunk_kda accepts when one is given
INPUT_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
# flash_kda_fwd's split pair's workspaces (kernels/kda_prepare_flashkda.kfc's WD); chunk_kda's are f32
# (kernels/kda_prepare_fla.kfc writes f32)
WORKSPACE = torch.float32
SPLIT_CHUNKS = (16,)  # the split pairs' chunk
SPLIT_LOWER_BOUND = -5.0  # ... and the least lower_bound flash_kda_fwd's is exact for (FlashKDA's range)
# chunk_kda's default for `split`: off until a GPU run has timed its pair (kernels/kda_prepare_fla.kfc)
# against its one kernel; bench.kda --fla times both
FLA_SPLIT = False
# the columns of V a CTA of the split pair's recurrence takes (kernels/kda_recurrence_split.kfc's
# VB): None, as recurrence_columns chooses; 0, all of V in one CTA (kernels/kda_recurrence.kfc)
RECURRENCE_COLUMNS: Optional[int] = None
SPLIT_V = (128, 64, 256)  # kernels/kda_recurrence_split.kfc's V
SPLIT_VB = (32, 64, 128)  # ... and its VB (kernels/kda_fwd_fla_split.kfc's too)
# the most state elements a CTA of kernels/kda_fwd_fla.kfc holds (f32 [128, 128], 64 KB, beside
# its chunk's tiles); past it chunk_kda takes the kernel over blocks of V's columns
WHOLE_STATE = 128 * 128
GATE_GIVEN, GATE_SOFTPLUS, GATE_LOWER_BOUND = 0, 1, 2  # kda_fwd_fla.kfc's gate_form
# the longest head dim K whose products over K chunk_kda's kernel takes in TF32; past it, in
# 3xTF32 (fla_pipeline)
TF32_HEAD_DIM = 128


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
              safe_gate: bool = False, lower_bound: Optional[float] = None, disable_recompute: bool = False,
              return_intermediate_states: bool = False, state_v_first: bool = False,
              cu_seqlens: Optional[Tensor] = None, cu_seqlens_cpu: Optional[Tensor] = None,
              cp_context=None, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
              chunk_size: Optional[int] = None, split: Optional[bool] = None, **kwargs):
    """fla's `chunk_kda` forward: (o [B, T, HV, V], final state [N, HV, K, V] or None).

    q, k [B, T, H, K] and v [B, T, HV, V] in bf16 or f16 (HV a multiple of H); g [B, T, HV, K]
    log-space gates, or raw ones with use_gate_in_kernel (then A_log [HV], dt_bias [HV * K]);
    beta [B, T, HV] probabilities, or logits with use_beta_sigmoid_in_kernel. initial_state in f32
    or bf16, [N, HV, K, V] ([N, HV, V, K] with state_v_first); the final state has its dtype (f32
    without one). chunk_size, as fla's, 32 or 64 (a ValueError otherwise, fla's); left out, kfc
    takes its fastest, 16. It changes the speed, not the result. disable_recompute and
    cu_seqlens_cpu concern fla's backward and scheduling: accepted, unused. With
    return_intermediate_states, (o, final state, h): h the state before each 64-token chunk of
    every sequence, [B, NT, HV, K, V] (with cu_seqlens [1, NT, ...], NT every sequence's chunks)
    in q's dtype, computed one launch per chunk (kfc.nn.kda_states): correct, not fast.
    `split` (kfc's own; default FLA_SPLIT): the chunks' state-independent work as a parallel
    kernel before the recurrence (kernels/kda_prepare_fla.kfc, then kernels/kda_recurrence.kfc,
    over blocks of V's columns where the state is wider than a CTA holds), at chunk 16 (with
    safe_gate, its decays as products on tensor cores); else one kernel."""
    what = "chunk_kda"
    if chunk_size is not None and chunk_size not in FLA_CHUNKS:
        raise ValueError(f"`chunk_size` must be either 32 or 64, got {chunk_size} (kfc.nn.kda.chunk_kda takes fla's "
                         "values; leave it out for kfc's fastest, 16)")
    if "transpose_state_layout" in kwargs:  # fla's former name of state_v_first
        state_v_first = bool(kwargs.pop("transpose_state_layout")) or state_v_first
    if kwargs:
        raise KfcError(f"{what}: unexpected argument {next(iter(kwargs))!r}",
                       hint="kfc.nn.kda.chunk_kda takes fla's chunk_kda arguments; see its docstring")
    if cp_context is not None:
        raise KfcError(f"{what}: context parallelism (cp_context) is not supported",
                       hint="run each device's sequences with cu_seqlens and pass states between them")
    if return_intermediate_states:  # (o, final state, h): chunk by chunk (kfc.nn.kda_states)
        B, T, H, K, HV, V = _shapes(what, q, k, v, g, beta, gate_heads=True)
        N, _ = _sequences(what, cu_seqlens, B, T, q.device, torch.int64)
        _state(what, initial_state, N, HV, K, V, state_v_first)
        options = dict(scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                       use_gate_in_kernel=use_gate_in_kernel,
                       use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                       allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound, A_log=A_log,
                       dt_bias=dt_bias, chunk_size=chunk_size)
        o, final, h = intermediate_states(chunk_kda, q, k, v, g, beta, initial_state, cu_seqlens, state_v_first,
                                          options)
        if state_v_first:
            final, h = final.transpose(-1, -2).contiguous(), h.transpose(-1, -2).contiguous()
        sd = torch.float32 if initial_state is None else initial_state.dtype
        return o, final.to(sd) if output_final_state else None, h
    chunk = _chunk(what, chunk_size)
    B, T, H, K, HV, V = _shapes(what, q, k, v, g, beta, gate_heads=True)
    if q.dtype not in INPUT_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise KfcError(f"{what}: q, k, v are {q.dtype}, {k.dtype}, {v.dtype}; kfc's kernel takes them all "
                       "bfloat16 or all float16", hint="convert them with .to(torch.bfloat16)")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise KfcError(f"{what}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True",
                       hint="pass beta as logits with use_beta_sigmoid_in_kernel=True")
    gate_form = GATE_GIVEN
    if use_gate_in_kernel:
        if A_log is None:
            raise KfcError(f"{what}: A_log must be given with use_gate_in_kernel=True", hint="pass A_log of [HV] values")
        gate_form = GATE_SOFTPLUS
        if safe_gate:
            if lower_bound is None or not -5 <= lower_bound < 0:
                raise KfcError(f"{what}: safe_gate with use_gate_in_kernel needs lower_bound in [-5, 0), "
                               f"got {lower_bound}", hint="pass lower_bound=-5.0")
            gate_form = GATE_LOWER_BOUND
    split = FLA_SPLIT if split is None else split
    blocks = pair_columns(K, V) if split and chunk in SPLIT_CHUNKS else None
    pair = blocks is not None
    N, offsets = _sequences(what, cu_seqlens, B, T, q.device, torch.int64 if pair else torch.int32)
    # the pair's recurrence keeps states V-first, the one kernel [K, V]
    state = _state(what, initial_state, N, HV, K, V, state_v_first, kernel_v_first=pair)
    _forward_only(what, q, k, v, g, beta, initial_state, A_log, dt_bias)

    given = dict(q=_packed(q), k=_packed(k), v=_packed(v), g=_packed(g.float()), beta=_packed(beta.float()),
                 cu_seqlens=offsets)
    if use_gate_in_kernel:
        given["A_log"] = _vector(what, "A_log", A_log, (HV,))
        if dt_bias is not None:
            given["dt_bias"] = _vector(what, "dt_bias", dt_bias, (HV, K))
    if state is not None:
        given["h0"] = state
    sd = torch.float32 if state is None else state.dtype
    o = torch.empty(1, B * T, HV, V, dtype=q.dtype, device=q.device)
    ht = torch.empty(N, HV, *((V, K) if pair else (K, V)), dtype=sd, device=q.device)
    given.update(scale=float(K ** -0.5 if scale is None else scale), gate_form=gate_form,
                 lower_bound=float(-5.0 if lower_bound is None else lower_bound),
                 qk_l2norm=int(bool(use_qk_l2norm_in_kernel)), beta_logits=int(bool(use_beta_sigmoid_in_kernel)),
                 beta_max=2.0 if allow_neg_eigval else 1.0)
    if pair:
        # safe_gate's gates lie above lower_bound >= -5: the decays as products (kda_prepare_fla.kfc's DECAY = 2)
        factored = gate_form == GATE_LOWER_BOUND and given["lower_bound"] >= -80.0 / chunk
        _prepared_then_recurrence("kda_prepare_fla", dict(C=chunk, DECAY=2 if factored else 1), given, (1, B * T, HV),
                                  K, V, torch.float32, N, (o, ht), sd, fla_pipeline(K), blocks or None)
    else:
        name, columns = fla_kernel(K, V)
        run(name, dict(C=chunk, SD=_kfc_dtype(sd), **columns), given, (o, ht), fla_pipeline(K))
    final = None
    if output_final_state:  # in the caller's layout: V-first with state_v_first
        final = ht if pair == state_v_first else ht.transpose(-1, -2).contiguous()
    return o.reshape(B, T, HV, V), final


def flash_kda_fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float, out: Tensor,
                  A_log: Tensor, dt_bias: Tensor, lower_bound: float, initial_state: Optional[Tensor] = None,
                  final_state: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                  chunk_size: Optional[int] = None, split: bool = True,
                  workspace: Optional[torch.dtype] = None) -> None:
    """FlashKDA's `fwd`: writes o into `out` [B, T, H, V] and, when given, the final state into
    `final_state`. q, k, v, g (raw gates), beta (logits) in bf16 [B, T, H, ...]; A_log [H] and
    dt_bias [H, K] in f32; states V-first, [N, H, V, K], in bf16 or f32; cu_seqlens int32 or int64
    with B = 1. Any K and V the shared memory holds (FlashKDA's own: 128). `split` (kfc's own,
    default on): the chunks' state-independent work as a parallel kernel of its own before the
    recurrence, where the chunk is 16 and lower_bound in [-5, 0] (FlashKDA's, within which that
    kernel's decays stay in f32's range); else, or with split=False, one kernel. `workspace`
    (kfc's own): the dtype of what the first kernel hands the second, torch.float32 or
    torch.bfloat16 (half the traffic, o a little further from the exact result); default
    WORKSPACE's."""
    what = "flash_kda_fwd"
    chunk = _chunk(what, chunk_size)
    B, T, H, K, _, V = _shapes(what, q, k, v, g, beta, gate_heads=False)
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("out", out)):
        if t.dtype != torch.bfloat16:
            raise KfcError(f"{what}: {name} is {t.dtype}; FlashKDA's interface takes it in bfloat16",
                           hint=f"convert it with {name}.to(torch.bfloat16)")
    if tuple(out.shape) != (B, T, H, V):
        raise KfcError(f"{what}: out has shape {tuple(out.shape)}, not v's {(B, T, H, V)}")
    N, offsets = _sequences(what, cu_seqlens, B, T, q.device, torch.int64)
    state = _state(what, initial_state, N, H, V, K, False)
    if final_state is not None:
        _state(what, final_state, N, H, V, K, False, name="final_state")
        if state is not None and final_state.dtype != state.dtype:
            raise KfcError(f"{what}: initial_state is {state.dtype} and final_state {final_state.dtype}; "
                           "FlashKDA's states share one dtype", hint="pass both in bfloat16 or both in float32")
    _forward_only(what, q, k, v, g, beta, initial_state, A_log, dt_bias)
    workspace = WORKSPACE if workspace is None else workspace
    if workspace not in (torch.float32, torch.bfloat16):
        raise KfcError(f"{what}: workspace {workspace} is not one kfc's split kernels take",
                       hint="pass torch.float32 or torch.bfloat16")
    sd = state.dtype if state is not None else final_state.dtype if final_state is not None else torch.float32
    ht = final_state if final_state is not None and final_state.is_contiguous() else \
        torch.empty(N, H, V, K, dtype=sd, device=q.device)
    o = out if out.is_contiguous() and out.data_ptr() % 16 == 0 else torch.empty_like(out, memory_format=torch.contiguous_format)
    given = dict(q=_packed(q), k=_packed(k), v=_packed(v), g=_packed(g), beta=_packed(beta),
                 A_log=_vector(what, "A_log", A_log, (H,)), dt_bias=_vector(what, "dt_bias", dt_bias, (H, K)))
    state_in = {} if state is None else {"h0": state}
    o_ht = (o.view(1, B * T, H, V), ht)
    if not (split and chunk in SPLIT_CHUNKS and SPLIT_LOWER_BOUND <= lower_bound <= 0):
        run("kda_fwd_flashkda", dict(C=chunk, SD=_kfc_dtype(sd)),
            dict(given, cu_seqlens=offsets, **state_in, scale=float(scale), lower_bound=float(lower_bound)), o_ht)
    else:
        given = dict(given, cu_seqlens=offsets, **state_in, scale=float(scale), lower_bound=float(lower_bound))
        _prepared_then_recurrence("kda_prepare_flashkda", dict(C=chunk, WD=_kfc_dtype(workspace)), given,
                                  (1, B * T, H), K, V, workspace, N, o_ht, sd)
    if o is not out:
        out.copy_(o)
    if final_state is not None and ht is not final_state:
        final_state.copy_(ht)


def _prepared_then_recurrence(prepare: str, bind: dict, given: dict, rows: tuple, K: int, V: int,
                              workspace: torch.dtype, N: int, o_ht: tuple, sd: torch.dtype,
                              pipeline: str | None = None, columns: int | None = None) -> None:
    """The split pair: `prepare` (bound by `bind`) stores every chunk's w, u, qg, kg, aqk and gend
    for all (chunk, head) at once into workspaces of `rows` [1, T, heads] (gend in f32, the
    rest in `workspace`), then the recurrence carries the state (`given`'s h0, V-first) across
    each sequence's chunks into o_ht (o [1, T, heads, V] in its dtype and the final state
    V-first): over blocks of `columns` of V's columns where given, else where
    recurrence_columns (or RECURRENCE_COLUMNS) says so. Both built by `pipeline`."""
    chunk = bind["C"]
    work = {n: torch.empty(*rows, d, dtype=torch.float32 if n == "gend" else workspace, device=o_ht[0].device)
            for n, d in (("w", K), ("u", V), ("qg", K), ("kg", K), ("aqk", chunk), ("gend", K))}
    run(prepare, bind, {n: x for n, x in given.items() if n != "h0"}, tuple(work.values()), pipeline)
    recur = dict(C=chunk, SD=_kfc_dtype(sd), WD=_kfc_dtype(workspace), O=_kfc_dtype(o_ht[0].dtype))
    state_in = {"h0": given["h0"]} if "h0" in given else {}
    heads = rows[2]
    vb = columns or (recurrence_columns(N * heads, V, o_ht[0].device) if RECURRENCE_COLUMNS is None
                     else RECURRENCE_COLUMNS)
    if vb and V in SPLIT_V and V % vb == 0:  # blocks of vb columns, a CTA each
        run("kda_recurrence_split", dict(recur, V=V, VB=vb), dict(work, cu_seqlens=given["cu_seqlens"], **state_in),
            o_ht, pipeline)
    else:
        run("kda_recurrence", recur, dict(work, cu_seqlens=given["cu_seqlens"], **state_in), o_ht, pipeline)


def recurrence_columns(pairs: int, V: int, device: torch.device) -> int:
    """The columns of V a recurrence CTA takes: the fewest (the most blocks) with which the
    pairs' blocks still run one an SM, where the (sequence, head) pairs leave SMs idle; else 0,
    all of V. Two blocks sharing an SM run slower than one CTA of both (docs/kda.md: on an H100
    at T = 8192, 64 pairs in blocks of 64 took 1.27 ms against 1.77 whole, 96 pairs 2.25 ms
    against 1.78)."""
    if device.type != "cuda" or V not in SPLIT_V:
        return 0
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    fit = [vb for vb in SPLIT_VB if vb < V and V % vb == 0 and pairs * (V // vb) <= sms]
    return min(fit, default=0)


def fla_kernel(K: int, V: int) -> tuple[str, dict]:
    """The kernel of chunk_kda at head dims K and V, and its size bindings: kernels/kda_fwd_fla.kfc,
    or where one CTA's shared memory holds less than the whole state with the chunk's tiles
    beside it, kernels/kda_fwd_fla_split.kfc over the widest blocks of V's columns whose state
    does (K = V = 256: four CTAs a head, [256, 64] each)."""
    if K * V <= WHOLE_STATE or V not in SPLIT_V:
        return "kda_fwd_fla", {}
    fit = [vb for vb in SPLIT_VB if vb < V and V % vb == 0 and K * vb <= WHOLE_STATE]
    return ("kda_fwd_fla_split", dict(V=V, VB=max(fit))) if fit else ("kda_fwd_fla", {})


def pair_columns(K: int, V: int) -> int | None:
    """How chunk_kda's pair carries the state at head dims K and V: 0, in one CTA a (sequence,
    head) where it holds the whole state (recurrence_columns may still split it); the columns of
    V a CTA takes where it does not (kda_recurrence_split.kfc, as fla_kernel's); None where
    neither is written (V not one the split kernel takes): then the one kernel."""
    if K * V <= WHOLE_STATE:
        return 0
    name, columns = fla_kernel(K, V)
    return columns["VB"] if name == "kda_fwd_fla_split" else None


def fla_pipeline(K: int) -> str | None:
    """chunk_kda's pipeline at head dim K: the default (None) up to TF32_HEAD_DIM, past it the
    default with its products in 3xTF32 (`tf32-dots{split=3}`). At K = 256 TF32 operands put one
    element of o 4% past the kernel's 5e-3 bound on an H100 (tests/gpu/test_kda_gpu.py, fla's
    D = 256), as the interpreter of the final IR does too; 3xTF32 meets it
    (tests/test_tf32x3.py)."""
    if K <= TF32_HEAD_DIM:
        return None
    from ..passes import TILE_PIPELINE  # lazy: kfc.passes pulls kfc.ir; only the widest heads need it

    return TILE_PIPELINE.replace("tf32-dots", "tf32-dots{split=3}")


def run(name: str, bind: dict, given: dict, outs: tuple, pipeline: str | None = None) -> None:
    """Launch the shipped kernel `name` (its chunk and state dtype bound; built by `pipeline`,
    else the default) on the inputs by name, writing `outs`. One place, so a test may run the
    interpreter here instead."""
    kernel(name, pipeline, **bind)(**given, out=outs)


# --- argument checks shared by both interfaces -------------------------------------------------

def _chunk(what: str, chunk_size: Optional[int]) -> int:
    chunk = DEFAULT_CHUNK if chunk_size is None else chunk_size
    if chunk not in CHUNKS:
        raise KfcError(f"{what}: chunk_size must be one of {', '.join(map(str, CHUNKS))}, got {chunk_size}",
                       hint="leave it out for the default, 16")
    return int(chunk)


def _shapes(what: str, q, k, v, g, beta, gate_heads: bool):
    """B, T, H, K, HV, V, each tensor's shape checked against q's and v's."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, Tensor):
            raise KfcError(f"{what}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or v.dim() != 4:
        raise KfcError(f"{what}: q must be [B, T, H, K] and v [B, T, HV, V], got {tuple(q.shape)} and {tuple(v.shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if tuple(k.shape) != tuple(q.shape):
        raise KfcError(f"{what}: k has shape {tuple(k.shape)}, not q's {tuple(q.shape)}")
    if tuple(v.shape[:2]) != (B, T):
        raise KfcError(f"{what}: v has shape {tuple(v.shape)}; its batch and length must be q's, {(B, T)}")
    if HV % H or (not gate_heads and HV != H):
        raise KfcError(f"{what}: v has {HV} heads and q {H}; " +
                       ("the value heads must be a multiple of q's" if gate_heads else "they must be equal"))
    if tuple(g.shape) != (B, T, HV, K):
        raise KfcError(f"{what}: g has shape {tuple(g.shape)}, not {(B, T, HV, K)} ([B, T, HV, K])")
    if tuple(beta.shape) != (B, T, HV):
        raise KfcError(f"{what}: beta has shape {tuple(beta.shape)}, not {(B, T, HV)} ([B, T, HV])")
    return B, T, H, K, HV, V


def _sequences(what: str, cu_seqlens: Optional[Tensor], B: int, T: int, device, dtype) -> tuple[int, Tensor]:
    """The number of sequences and their offsets on the device: cu_seqlens as given (int32 or
    int64, converted where the kernel takes the other), else B sequences of T."""
    if cu_seqlens is None:
        return B, torch.arange(0, B + 1, dtype=dtype, device=device) * T
    if B != 1:
        raise KfcError(f"{what}: with cu_seqlens the batch size must be 1, got {B}",
                       hint="flatten the sequences into one: x.reshape(1, -1, *x.shape[2:])")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise KfcError(f"{what}: cu_seqlens must be a 1-D int32 or int64 tensor of N + 1 offsets, got "
                       f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
    offsets = cu_seqlens.to(device=device, dtype=torch.int64 if dtype == torch.int64 else cu_seqlens.dtype)
    return cu_seqlens.numel() - 1, ready(offsets)


def _state(what: str, state: Optional[Tensor], N: int, HV: int, K: int, V: int, v_first: bool,
           name: str = "initial_state", kernel_v_first: bool = False) -> Optional[Tensor]:
    """The state, given [N, HV, V, K] where v_first else [N, HV, K, V], as the kernel reads it:
    [N, HV, K, V], or [N, HV, V, K] where kernel_v_first (transposed, a copy, where they differ)."""
    if state is None:
        return None
    want = (N, HV, V, K) if v_first else (N, HV, K, V)
    if tuple(state.shape) != want:
        raise KfcError(f"{what}: {name} has shape {tuple(state.shape)}, not {want} (one state per sequence)")
    if state.dtype not in STATE_DTYPES:
        raise KfcError(f"{what}: {name} is {state.dtype}; kfc's kernels keep states in float32 or bfloat16",
                       hint=f"convert it with {name}.float()")
    return ready(state.transpose(-1, -2) if v_first != kernel_v_first else state)


def _vector(what: str, name: str, t: Tensor, shape: tuple) -> Tensor:
    """A per-head parameter as the kernel reads it: f32, in `shape` (fla's [HV * K] dt_bias as [HV, K])."""
    if t.numel() != torch.Size(shape).numel():
        raise KfcError(f"{what}: {name} has {t.numel()} elements, not {' x '.join(map(str, shape))}")
    return ready(t.detach().reshape(shape).float())


def _packed(x: Tensor) -> Tensor:
    """[B, T, ...] as one packed sequence [1, B * T, ...]."""
    return ready(x.reshape(1, x.shape[0] * x.shape[1], *x.shape[2:]))


def _forward_only(what: str, *tensors: Optional[Tensor]) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise KfcError(f"{what}: kfc computes KDA's forward only; these inputs require a gradient",
                       hint="call it under torch.no_grad() or torch.inference_mode(), or pass detached tensors")


def _kfc_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
