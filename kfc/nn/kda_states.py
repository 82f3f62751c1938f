"""fla's `return_intermediate_states`: the state before each 64-token chunk of every sequence
(fla's h, [B, NT, HV, K, V], or [1, NT, HV, K, V] with cu_seqlens, NT counting every sequence's
chunks), beside o and the final state.

kfc's kernels keep each chunk's state on chip, so this runs the forward chunk by chunk: the
i-th 64 tokens of every sequence still running as one varlen call, each sequence's state carried
from the call before in f32. The same recurrence, in NT_max launches instead of one: for
inspecting states, not for speed.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

STATE_CHUNK = 64  # fla's chunk, by which its intermediate states are counted


def intermediate_states(forward: Callable, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                        initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], state_v_first: bool,
                        options: dict) -> tuple[Tensor, Tensor, Tensor]:
    """(o [B, T, HV, V], final state [N, HV, K, V] in f32, h [B or 1, NT, HV, K, V] in q's dtype)
    by `forward` (chunk_kda without intermediate states) over each 64-token chunk in turn.
    States are [N, HV, K, V] here; the caller lays them out V-first where asked."""
    B, T, HV, V = v.shape
    K = q.shape[-1]
    if cu_seqlens is None:
        bounds = [(n * T, (n + 1) * T) for n in range(B)]
    else:
        cuts = [int(x) for x in cu_seqlens.tolist()]
        bounds = list(zip(cuts[:-1], cuts[1:]))
    flat = [x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
    N = len(bounds)
    counts = [-(-(end - start) // STATE_CHUNK) for start, end in bounds]
    first = [sum(counts[:n]) for n in range(N)]  # sequence n's chunks in h, in order
    state = torch.zeros(N, HV, K, V, dtype=torch.float32, device=q.device) if initial_state is None else \
        (initial_state.transpose(-1, -2) if state_v_first else initial_state).float().clone()
    h = torch.empty(1, sum(counts), HV, K, V, dtype=q.dtype, device=q.device)
    o = torch.empty(1, B * T, HV, V, dtype=v.dtype, device=v.device)
    for i in range(max(counts, default=0)):
        live = [n for n in range(N) if counts[n] > i]
        pieces = [(bounds[n][0] + i * STATE_CHUNK, min(bounds[n][0] + (i + 1) * STATE_CHUNK, bounds[n][1]))
                  for n in live]
        for n in live:
            h[0, first[n] + i] = state[n].to(q.dtype)
        rows = torch.cat([torch.arange(a, b) for a, b in pieces]).to(q.device)
        cu = torch.tensor([0] + [b - a for a, b in pieces], dtype=torch.int64).cumsum(0).to(q.device)
        o_i, final = forward(*(x[:, rows] for x in flat), initial_state=state[live], output_final_state=True,
                             cu_seqlens=cu, **options)
        o[:, rows] = o_i
        state[live] = final.float()
    h = h.reshape(B, -1, HV, K, V) if cu_seqlens is None else h
    return o.reshape(B, T, HV, V), state, h
