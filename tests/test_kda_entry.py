"""kfc.nn.kda: fla's chunk_kda and FlashKDA's fwd mapped onto the shipped KDA kernels. The
kernel launch is replaced by the interpreter on the same kernel (kfc.nn.kda.run), so each
interface's argument mapping (gate forms, L2 norm, beta logits, batches, grouped heads, state
layouts and dtypes) is checked on the CPU against the float64 recurrence; the GPU runs the same
calls in tests/gpu/test_kda_gpu.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kfc.check.runner import compare
from kfc.diagnostics import KfcError
from kfc.ir.interpreter import run
from kfc.library import kernel_path
from kfc.runtime.kernel import load
from kfc.nn import kda
from kfc.reference.kda import kda_fla_gated, kda_flashkda, kda_recurrent

TOLERANCE = 5e-3  # the kernels' own (kernels/kda_fwd_fla.kfc's check)


def interpreted(name, bind, given, outs, pipeline=None):
    """kda.run on the interpreter: the kernel instantiated for the tensors' dtypes, as the
    runtime instantiates it, run on their values (as written: the pipeline is the GPU's), its
    outputs copied into `outs`. As written, a `where` on a size parameter computes both branches:
    kda_prepare_fla's factorised decays overflow where DECAY = 1 (the branch not taken)."""
    func = load(kernel_path(name), bind=bind).instance_for(given).func
    types = {a.name: a.ttype.dtype for a in func.args}
    args = {n: (v.float().numpy().astype(types[n].np) if v.is_floating_point() else v.numpy())
            if isinstance(v, torch.Tensor) else v for n, v in given.items()}
    with np.errstate(over="ignore", invalid="ignore"):
        got = run(func, args)
    for out, v in zip(outs, func.outputs):
        out.copy_(torch.from_numpy(got[v.name].astype(np.float32)).reshape(out.shape))


@pytest.fixture(autouse=True)
def on_the_interpreter(monkeypatch):
    monkeypatch.setattr(kda, "run", interpreted)


def close(name, got, want):
    _, rel, ok, note = compare(got.float().numpy(), want.float().numpy(), TOLERANCE)
    assert ok, f"{name}: {note or f'relative RMSE {rel:.3g}'}"


def draw(B, T, H, HV, K, V, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g).to(dtype)
    k = torch.randn(B, T, H, K, generator=g).to(dtype)
    v = torch.randn(B, T, HV, V, generator=g).to(dtype)
    raw = torch.randn(B, T, HV, K, generator=g)
    beta = torch.randn(B, T, HV, generator=g)
    h0 = torch.randn(B, HV, K, V, generator=g)
    return q, k, v, raw, beta, h0


def test_fla_default_gates_given_batch_of_two():
    """fla's default: log-space gates (f32, with resets of -1e3), q and k normalised by the caller,
    beta as probabilities; B = 2 without cu_seqlens runs as two packed sequences."""
    q, k, v, raw, beta, h0 = draw(2, 21, 2, 2, 8, 8)
    q, k = (F.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
    g = F.logsigmoid(raw)
    g[..., 0, 0] = -1e3
    o, ht = kda.chunk_kda(q, k, v, g, beta.sigmoid().bfloat16(), initial_state=h0, output_final_state=True)
    want_o, want_ht = kda_recurrent(q.double(), k.double(), v.double(), g.double(), beta.sigmoid().bfloat16().double(),
                                    None, h0.double())
    assert o.shape == v.shape and o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    close("o", o, want_o)
    close("ht", ht, want_ht)


def test_fla_gate_in_kernel_with_grouped_heads_and_int64_offsets():
    """use_gate_in_kernel (softplus form, fla's dt_bias [HV * K]) with the L2 norm in the kernel,
    two value heads a q/k head, varlen with int64 offsets, f16 inputs, the chunk 16."""
    q, k, v, raw, beta, _ = draw(1, 40, 1, 2, 8, 8, dtype=torch.float16)
    cu = torch.tensor([0, 13, 40], dtype=torch.int64)
    h0 = torch.randn(2, 2, 8, 8)  # a state per sequence
    A_log, dt_bias = torch.randn(2), torch.randn(2 * 8)
    o, ht = kda.chunk_kda(q, k, v, raw.half(), beta.sigmoid().half(), initial_state=h0, output_final_state=True,
                          use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                          cu_seqlens=cu)  # the default chunk, 16
    want_o, want_ht = kda_fla_gated(q, k, v, raw.half(), beta.sigmoid().half(), A_log, dt_bias, cu, h0=h0)
    assert o.dtype == torch.float16
    close("o", o, want_o)
    close("ht", ht, want_ht)


def test_fla_safe_gate_beta_logits_and_state_v_first():
    """safe_gate with the gate in the kernel (lower_bound * sigmoid), beta as logits doubled
    (allow_neg_eigval), the state V-first in and out, in bf16."""
    q, k, v, raw, beta, h0 = draw(1, 30, 2, 2, 8, 16)
    h0 = h0.bfloat16()
    A_log = torch.randn(2)
    o, ht = kda.chunk_kda(q, k, v, raw.bfloat16(), beta.bfloat16(), initial_state=h0.transpose(-1, -2).contiguous(),
                          output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                          A_log=A_log, safe_gate=True, lower_bound=-3.0, use_beta_sigmoid_in_kernel=True,
                          allow_neg_eigval=True, state_v_first=True, chunk_size=32)
    cu = torch.tensor([0, 30])
    want_o, want_ht = kda_fla_gated(q, k, v, raw.bfloat16(), beta.bfloat16(), A_log, None, cu, h0=h0.float(),
                                    gate_form=2, lower_bound=-3.0, beta_logits=1, beta_max=2.0)
    assert ht.dtype == torch.bfloat16 and ht.shape == (1, 2, 16, 8)
    close("o", o, want_o)
    close("ht", ht.transpose(-1, -2), want_ht)


def test_fla_without_final_state_returns_none():
    q, k, v, raw, beta, _ = draw(1, 9, 1, 1, 8, 8)
    o, ht = kda.chunk_kda(q, k, v, F.logsigmoid(raw), beta.sigmoid().bfloat16(), use_qk_l2norm_in_kernel=True)
    assert ht is None and o.shape == (1, 9, 1, 8)


def test_fla_heads_of_256_run_over_blocks_of_their_columns(monkeypatch):
    """K = V = 256 (fla's D = 256 cases): the whole state does not fit one CTA, so chunk_kda runs
    kernels/kda_fwd_fla_split.kfc, four CTAs of 64 columns a head, its products in 3xTF32, as
    the float64 recurrence; heads of 128 keep the whole kernel."""
    launched = []

    def recorded(name, bind, given, outs, pipeline=None):
        launched.append((name, bind, pipeline))
        interpreted(name, bind, given, outs)

    monkeypatch.setattr(kda, "run", recorded)
    q, k, v, raw, beta, h0 = draw(1, 19, 1, 1, 256, 256)
    q, k = (F.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
    g = F.logsigmoid(raw)
    o, ht = kda.chunk_kda(q, k, v, g, beta.sigmoid().bfloat16(), initial_state=h0, output_final_state=True)
    assert launched == [("kda_fwd_fla_split", dict(C=16, SD="f32", V=256, VB=64),
                         "approx-math,canonicalize,cse,dce,hoist-loads,sink-stores,tf32-dots{split=3}")]
    want_o, want_ht = kda_recurrent(q.double(), k.double(), v.double(), g.double(), beta.sigmoid().bfloat16().double(),
                                    None, h0.double())
    close("o", o, want_o)
    close("ht", ht, want_ht)
    assert kda.fla_kernel(128, 128) == ("kda_fwd_fla", {}) and kda.fla_kernel(64, 256) == ("kda_fwd_fla", {})
    assert kda.fla_kernel(128, 256) == ("kda_fwd_fla_split", dict(V=256, VB=128))


def test_fla_intermediate_states_are_the_states_before_each_64_tokens():
    """return_intermediate_states (fla's test_chunk_return_intermediate_states): h [B, NT, HV, K, V]
    in q's dtype, h[:, i] the state after each sequence's first 64 i tokens (the float64
    recurrence on that prefix); with cu_seqlens [1, NT, ...], every sequence's chunks in turn;
    o and the final state as without it."""
    q, k, v, raw, beta, h0 = draw(2, 150, 2, 2, 8, 8)
    q, k = (F.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
    g, b = F.logsigmoid(raw), beta.sigmoid().bfloat16()
    o, ht, h = kda.chunk_kda(q, k, v, g, b, initial_state=h0, output_final_state=True,
                             return_intermediate_states=True)
    assert h.shape == (2, 3, 2, 8, 8) and h.dtype == torch.bfloat16
    want_o, want_ht = kda_recurrent(q.double(), k.double(), v.double(), g.double(), b.double(), None,
                                    h0.double())
    close("o", o, want_o)
    close("ht", ht, want_ht)
    for i in range(3):
        t = 64 * i
        want = h0 if i == 0 else kda_recurrent(q[:, :t].double(), k[:, :t].double(), v[:, :t].double(),
                                               g[:, :t].double(), b[:, :t].double(), None, h0.double())[1]
        close(f"h[:, {i}]", h[:, i], want)
    cu = torch.tensor([0, 100, 230])
    x = [t.reshape(1, 300, *t.shape[2:])[:, :230] for t in (q, k, v, g, b)]
    o, ht, h = kda.chunk_kda(*x, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                             return_intermediate_states=True, state_v_first=False)
    assert h.shape == (1, 5, 2, 8, 8)  # 2 chunks of the first sequence, 3 of the second
    torch.testing.assert_close(h[0, [0, 2]].float(), h0.bfloat16().float())
    want = kda_recurrent(*(t[:, :64].double() for t in x), None, h0[:1].double())[1]
    close("h[0, 1]", h[0, 1:2], want)


def test_flash_kda_fwd_writes_out_and_the_final_state_in_place():
    """FlashKDA's fwd: a batch of two, bf16 states V-first, out and final_state written in place."""
    q, k, v, raw, beta, h0 = draw(2, 19, 2, 2, 16, 8)
    A_log, dt_bias = torch.randn(2) * 0.5, torch.randn(2, 16)
    h0 = h0.transpose(-1, -2).contiguous().bfloat16()  # [N, H, V, K]
    out = torch.full_like(v, float("nan"))
    final = torch.full_like(h0, float("nan"))
    assert kda.flash_kda_fwd(q, k, v, raw.bfloat16(), beta.bfloat16(), 0.25, out, A_log, dt_bias, -5.0,
                             initial_state=h0, final_state=final) is None
    cu = torch.tensor([0, 19, 38])
    want_o, want_ht = kda_flashkda(*(x.reshape(1, 38, *x.shape[2:]) for x in (q, k, v, raw.bfloat16(), beta.bfloat16())),
                                   A_log, dt_bias, cu, h0=h0.float(), scale=0.25)
    close("out", out.reshape(1, 38, 2, 8), want_o)
    close("final_state", final, want_ht)


@pytest.mark.parametrize("call, message", [
    (dict(allow_neg_eigval=True), "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    (dict(use_gate_in_kernel=True), "A_log must be given"),
    (dict(use_gate_in_kernel=True, A_log=torch.zeros(1), safe_gate=True), "needs lower_bound in \\[-5, 0\\)"),
    (dict(cu_seqlens=torch.tensor([0, 5, 9])), "with cu_seqlens the batch size must be 1, got 2"),
    (dict(initial_state=torch.zeros(2, 1, 8, 4)), "initial_state has shape \\(2, 1, 8, 4\\), not \\(2, 1, 8, 8\\)"),
    (dict(bogus=1), "unexpected argument 'bogus'"),
])
def test_fla_interface_refuses_what_it_cannot_do_by_name(call, message):
    q, k, v, raw, beta, _ = draw(2, 9, 1, 1, 8, 8)
    with pytest.raises(KfcError, match=message):
        kda.chunk_kda(q, k, v, raw, beta, **call)


@pytest.mark.parametrize("chunk", [16, 48])
def test_fla_interface_takes_flas_chunk_sizes_and_raises_its_value_error_otherwise(chunk):
    q, k, v, raw, beta, _ = draw(1, 9, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="`chunk_size` must be either 32 or 64"):
        kda.chunk_kda(q, k, v, raw, beta, chunk_size=chunk)


def test_forward_only_refuses_a_call_that_wants_a_gradient():
    q, k, v, raw, beta, _ = draw(1, 9, 1, 1, 8, 8)
    q.requires_grad_(True)
    with pytest.raises(KfcError, match="forward only"):
        kda.chunk_kda(q, k, v, raw, beta)
    with torch.no_grad():
        kda.chunk_kda(q, k, v, F.logsigmoid(raw), beta.sigmoid())


def test_f32_inputs_are_refused_with_the_dtypes_the_kernel_takes():
    q, k, v, raw, beta, _ = draw(1, 9, 1, 1, 8, 8, dtype=torch.float32)
    with pytest.raises(KfcError, match="all bfloat16 or all float16"):
        kda.chunk_kda(q, k, v, raw, beta)


def launches_recorded(monkeypatch, pipelines=False):
    """kda.run on the interpreter, each launch's kernel name and bindings (and pipeline, where
    asked) kept in the list returned. A prepare kernel takes no state."""
    launched = []

    def recorded(name, bind, given, outs, pipeline=None):
        assert not (name.startswith("kda_prepare") and "h0" in given), "the state given to a prepare kernel"
        launched.append((name, dict(bind), pipeline) if pipelines else (name, dict(bind)))
        interpreted(name, bind, given, outs)

    monkeypatch.setattr(kda, "run", recorded)
    return launched


def test_fla_split_pair_with_resets_matches_the_recurrence_and_the_one_kernel(monkeypatch):
    """chunk_kda(split=True): kernels/kda_prepare_fla.kfc for every (chunk, head), then the
    recurrence, on fla's log-space gates with resets of -1e5 (the decays taken pair by pair stay
    exact), varlen with an empty sequence and one shorter than a chunk, an f32 state [K, V]: as
    the float64 recurrence and as the one kernel (split=False)."""
    launched = launches_recorded(monkeypatch)
    cu = torch.tensor([0, 37, 37, 42, 112], dtype=torch.int32)
    q, k, v, raw, beta, _ = draw(1, 112, 2, 2, 16, 8, seed=7)
    q, k = (F.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
    g = F.logsigmoid(raw)
    g[0, 3, 0, :4] = -1e5
    g[0, 60, 1, 5] = -1e5
    h0 = torch.randn(4, 2, 16, 8)
    b = beta.sigmoid()
    want_o, want_ht = kda_recurrent(q.double(), k.double(), v.double(), g.double(), b.double(), cu, h0.double())
    got = {}
    for split in (True, False):
        launched.clear()
        o, ht = kda.chunk_kda(q, k, v, g, b, initial_state=h0, output_final_state=True, cu_seqlens=cu, split=split)
        close(f"o, split={split}", o, want_o)
        close(f"ht, split={split}", ht, want_ht)
        got[split] = o
    close("split against one kernel", got[True], got[False])
    launched.clear()
    kda.chunk_kda(q, k, v, g, b, initial_state=h0, cu_seqlens=cu, split=True)
    assert launched == [("kda_prepare_fla", dict(C=16, DECAY=1)),
                        ("kda_recurrence", dict(C=16, SD="f32", WD="f32", O="bf16"))]


@pytest.mark.parametrize("v_first", [False, True])
def test_fla_split_pair_takes_every_gate_form_grouped_heads_and_either_state_layout(monkeypatch, v_first):
    """The pair with the gate in the kernel (softplus, and safe_gate's lower-bound form, whose
    decays the prepare kernel takes as products of factors), the L2 norm in the kernel, beta as
    logits doubled (allow_neg_eigval), two value heads a q/k head,
    a batch of two, and a bf16 state given and returned [K, V] or V-first."""
    launched = launches_recorded(monkeypatch)
    q, k, v, raw, beta, h0 = draw(2, 23, 1, 2, 8, 16, seed=11)
    h0 = h0.bfloat16()
    A_log, dt_bias = torch.randn(2), torch.randn(2 * 8)
    state = h0.transpose(-1, -2).contiguous() if v_first else h0
    for safe in (False, True):
        launched.clear()
        o, ht = kda.chunk_kda(q, k, v, raw.bfloat16(), beta.bfloat16(), initial_state=state, output_final_state=True,
                              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                              safe_gate=safe, lower_bound=-4.0 if safe else None, use_beta_sigmoid_in_kernel=True,
                              allow_neg_eigval=True, state_v_first=v_first, split=True)
        assert [n for n, _ in launched] == ["kda_prepare_fla", "kda_recurrence"]
        assert launched[0][1]["DECAY"] == (2 if safe else 1)  # safe_gate's bounded gates: decays as products
        for n in range(2):  # the batch's rows as sequences of their own
            want_o, want_ht = kda_fla_gated(q[n:n + 1], k[n:n + 1], v[n:n + 1], raw[n:n + 1].bfloat16(),
                                            beta[n:n + 1].bfloat16(), A_log, dt_bias, torch.tensor([0, 23]),
                                            h0=h0[n:n + 1].float(), gate_form=2 if safe else 1, lower_bound=-4.0,
                                            beta_logits=1, beta_max=2.0)
            close(f"o[{n}], safe_gate={safe}", o[n:n + 1], want_o)
            assert ht.dtype == torch.bfloat16
            close(f"ht[{n}], safe_gate={safe}", ht[n:n + 1].transpose(-1, -2) if v_first else ht[n:n + 1], want_ht)


def test_fla_split_pair_is_left_for_the_one_kernel_where_it_does_not_hold(monkeypatch):
    """split=True runs the one kernel at chunk 32 and the pair at 16; left out, split is FLA_SPLIT's."""
    launched = launches_recorded(monkeypatch)
    q, k, v, raw, beta, _ = draw(1, 20, 1, 1, 8, 8)
    g, b = F.logsigmoid(raw), beta.sigmoid()
    for kwargs, name in ((dict(chunk_size=32), "kda_fwd_fla"), (dict(), "kda_prepare_fla")):
        launched.clear()
        kda.chunk_kda(q, k, v, g, b, split=True, **kwargs)
        assert launched[0][0] == name, kwargs
    for default, name in ((True, "kda_prepare_fla"), (False, "kda_fwd_fla")):
        monkeypatch.setattr(kda, "FLA_SPLIT", default)
        launched.clear()
        kda.chunk_kda(q, k, v, g, b)
        assert launched[0][0] == name, default


def test_fla_split_pair_writes_f16_outputs_and_carries_wide_states_over_blocks_of_columns(monkeypatch):
    """The pair with f16 inputs (the recurrence writes o in f16: its O) and at K = V = 256, where
    one CTA cannot hold the whole state: the recurrence over blocks of 64 of V's columns, both
    kernels' products in 3xTF32 (fla_pipeline), as the float64 recurrence. pair_columns says which."""
    launched = launches_recorded(monkeypatch, pipelines=True)
    for K, dtype in ((8, torch.float16), (256, torch.bfloat16)):
        launched.clear()
        q, k, v, raw, beta, h0 = draw(1, 19, 1, 1, K, K, dtype=dtype, seed=K)
        q, k = (F.normalize(x.float(), dim=-1).to(dtype) for x in (q, k))
        g, b = F.logsigmoid(raw), beta.sigmoid()
        o, ht = kda.chunk_kda(q, k, v, g, b.to(dtype), initial_state=h0, output_final_state=True, split=True)
        want_o, want_ht = kda_recurrent(q.double(), k.double(), v.double(), g.double(), b.to(dtype).double(), None,
                                        h0.double())
        assert o.dtype == dtype
        close(f"o, K={K}", o, want_o)
        close(f"ht, K={K}", ht, want_ht)
        (prep, pbind, ppipe), (rec, rbind, rpipe) = launched
        assert prep == "kda_prepare_fla" and rbind["O"] == kda._kfc_dtype(dtype)
        if K == 256:
            assert rec == "kda_recurrence_split" and rbind["VB"] == 64 and ppipe == rpipe == kda.fla_pipeline(256)
        else:
            assert rec == "kda_recurrence" and ppipe is None
    assert kda.pair_columns(128, 128) == 0 and kda.pair_columns(256, 256) == 64 and kda.pair_columns(128, 256) == 128
    assert kda.pair_columns(256, 100) is None


def test_flash_kda_fwd_split_matches_the_recurrence_and_the_one_kernel():
    """The split pair (prepare for every chunk at once, then the recurrence) on varlen sequences
    (one empty, one shorter than a chunk) with an f32 state, gates near lower_bound = -5 (the
    decays' factors at their bound): as the float64 recurrence, and as the one kernel."""
    lengths = [37, 0, 5, 70]
    T = sum(lengths)
    q, k, v, raw, beta, _ = draw(1, T, 2, 2, 16, 8, seed=3)
    raw = raw * 4 + 2  # sigmoid near 1 for most: gates near lower_bound
    A_log, dt_bias = torch.randn(2) * 0.5, torch.randn(2, 16)
    cu = torch.tensor([0, 37, 37, 42, 112])
    h0 = torch.randn(4, 2, 8, 16)
    want_o, want_ht = kda_flashkda(q, k, v, raw.bfloat16(), beta.bfloat16(), A_log, dt_bias, cu, h0=h0, scale=0.25)
    got = {}
    for split in (True, False):
        out, final = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        kda.flash_kda_fwd(q, k, v, raw.bfloat16(), beta.bfloat16(), 0.25, out, A_log, dt_bias, -5.0,
                          initial_state=h0, final_state=final, cu_seqlens=cu, split=split)
        close(f"out, split={split}", out, want_o)
        close(f"final_state, split={split}", final, want_ht)
        got[split] = out
    close("split against one kernel", got[True], got[False])


def test_flash_kda_fwd_hands_bf16_workspaces_between_its_kernels_where_asked(monkeypatch):
    """workspace=torch.bfloat16: the prepare kernel writes w, u, qg, kg and aqk in bf16 (gend
    stays f32) and the recurrence reads them so; o within 5e-3 of the float64 recurrence's in
    relative RMSE. Any other dtype is refused by name."""
    bound = []
    def recorded(name, bind, given, outs, pipeline=None):
        bound.append((name, bind.get("WD"), [t.dtype for t in outs]))
        interpreted(name, bind, given, outs)

    monkeypatch.setattr(kda, "run", recorded)
    lengths = [37, 21]
    q, k, v, raw, beta, _ = draw(1, sum(lengths), 2, 2, 16, 8, seed=5)
    A_log, dt_bias = torch.randn(2) * 0.5, torch.randn(2, 16)
    cu = torch.tensor([0, 37, 58])
    want_o, _ = kda_flashkda(q, k, v, raw.bfloat16(), beta.bfloat16(), A_log, dt_bias, cu, scale=0.25)
    out = torch.full_like(v, float("nan"))
    kda.flash_kda_fwd(q, k, v, raw.bfloat16(), beta.bfloat16(), 0.25, out, A_log, dt_bias, -5.0, cu_seqlens=cu,
                      workspace=torch.bfloat16)
    # bf16 between the kernels: single elements may stray past the kernels' 5e-3, the whole not
    _, rel, _, _ = compare(out.float().numpy(), want_o.float().numpy(), TOLERANCE)
    assert rel < 5e-3, rel
    assert [(n, wd) for n, wd, _ in bound] == [("kda_prepare_flashkda", "bf16"), ("kda_recurrence", "bf16")]
    assert bound[0][2] == [torch.bfloat16] * 5 + [torch.float32]  # w, u, qg, kg, aqk; gend
    with pytest.raises(KfcError, match="workspace torch.float16"):
        kda.flash_kda_fwd(q, k, v, raw.bfloat16(), beta.bfloat16(), 0.25, out, A_log, dt_bias, -5.0, cu_seqlens=cu,
                          workspace=torch.float16)


def test_flash_kda_fwd_takes_one_kernel_where_the_split_pair_does_not_hold(monkeypatch):
    """Chunk 32 or 64, or a lower_bound below FlashKDA's -5, runs the one kernel (the prepare kernel's
    decay factors would leave f32's range); FlashKDA's own cases run the pair."""
    launched = []
    def recorded(name, bind, given, outs, pipeline=None):
        launched.append(name)
        interpreted(name, bind, given, outs)

    monkeypatch.setattr(kda, "run", recorded)
    q, k, v, raw, beta, _ = draw(1, 20, 1, 1, 8, 8)
    args = (q, k, v, raw.bfloat16(), beta.bfloat16(), 0.3, torch.empty_like(v), torch.zeros(1), torch.zeros(1, 8))
    for chunk, lower_bound, names in ((16, -5.0, ["kda_prepare_flashkda", "kda_recurrence"]),
                                      (64, -5.0, ["kda_fwd_flashkda"]), (16, -8.0, ["kda_fwd_flashkda"])):
        launched.clear()
        kda.flash_kda_fwd(*args, lower_bound, chunk_size=chunk)
        assert launched == names, (chunk, lower_bound)


def test_flash_kda_fwd_runs_the_recurrence_over_blocks_of_columns_where_asked(monkeypatch):
    """kfc.nn.kda.RECURRENCE_COLUMNS = 32 at V = 64: the recurrence as two CTAs of 32 columns a
    (sequence, head) (kernels/kda_recurrence_split.kfc), as the float64 recurrence and as the
    whole (left to recurrence_columns, which on the CPU keeps it whole); at a V the split kernel
    is not written for, the whole recurrence."""
    launched = []
    def recorded(name, bind, given, outs, pipeline=None):
        launched.append((name, bind.get("VB")))
        interpreted(name, bind, given, outs)

    monkeypatch.setattr(kda, "run", recorded)
    lengths = [37, 5, 40]
    q, k, v, raw, beta, _ = draw(1, sum(lengths), 2, 2, 16, 64, seed=5)
    A_log, dt_bias = torch.randn(2) * 0.5, torch.randn(2, 16)
    cu = torch.tensor([0, 37, 42, 82])
    h0 = torch.randn(3, 2, 64, 16)
    want_o, want_ht = kda_flashkda(q, k, v, raw.bfloat16(), beta.bfloat16(), A_log, dt_bias, cu, h0=h0, scale=0.25)
    got = {}
    for vb in (32, None):
        monkeypatch.setattr(kda, "RECURRENCE_COLUMNS", vb)
        launched.clear()
        out, final = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        kda.flash_kda_fwd(q, k, v, raw.bfloat16(), beta.bfloat16(), 0.25, out, A_log, dt_bias, -5.0,
                          initial_state=h0, final_state=final, cu_seqlens=cu)
        assert launched[-1] == (("kda_recurrence_split", 32) if vb else ("kda_recurrence", None))
        close(f"out, columns {vb}", out, want_o)
        close(f"final_state, columns {vb}", final, want_ht)
        got[vb] = (out, final)
    close("blocks against the whole", got[32][0], got[None][0])
    launched.clear()
    monkeypatch.setattr(kda, "RECURRENCE_COLUMNS", 32)
    q, k, v, raw, beta, _ = draw(1, 20, 1, 1, 8, 8)
    kda.flash_kda_fwd(q, k, v, raw.bfloat16(), beta.bfloat16(), 0.3, torch.empty_like(v), torch.zeros(1),
                      torch.zeros(1, 8), -5.0)
    assert launched[-1] == ("kda_recurrence", None)


@pytest.mark.parametrize("pairs, V, columns", [(64, 128, 64), (96, 128, 0), (20, 128, 32), (768, 128, 0),
                                               (16, 64, 32), (20, 100, 0)])
def test_the_recurrence_is_split_into_the_most_blocks_that_still_run_one_an_sm(monkeypatch, pairs, V, columns):
    class H100:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: H100)
    assert kda.recurrence_columns(pairs, V, torch.device("cuda")) == columns
    assert kda.recurrence_columns(pairs, V, torch.device("cpu")) == 0
