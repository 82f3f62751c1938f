"""KDA's prepare kernel (kernels/kda_prepare_flashkda.kfc) finds each chunk slot's sequence by a
bisection over cu_seqlens. On the interpreter, the kernel as written computes every chunk of
many sequences of every length around the chunk's (empty ones, one token, C - 1, C, C + 1) as
the float64 reference does and writes no row outside them; the slot scheme its comment states
gives each chunk exactly one slot in log2(N) steps (a row's values cannot tell how many slots
computed it). The GPU runs its final IR (tests/gpu/test_final_ir_gpu.py)."""

import math
import re

import numpy as np
import pytest
import torch

from kfc.compile import compile_op
from kfc.frontend import load_kfc
from kfc.ir.interpreter import run_tracked
from kfc.library import kernel_path
from kfc.model.target import parse_target
from kfc.reference.kda import kda_prepare_flashkda
from kfc.runtime.kernel import load

C = 16
OUTPUTS = ("w", "u", "qg", "kg", "aqk", "gend")


def prepared(lengths, start=0, H=2, K=8, V=8, seed=0):
    """The kernel on the interpreter and the float64 reference, for sequences of `lengths` from
    row `start` on: (outputs, which op wrote each element, reference, cu_seqlens)."""
    T = start + sum(lengths)
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, T, H, K, generator=g).bfloat16() for _ in range(2))
    v = torch.randn(1, T, H, V, generator=g).bfloat16()
    raw = (torch.randn(1, T, H, K, generator=g) * 2).bfloat16()
    beta = torch.randn(1, T, H, generator=g).bfloat16()
    A_log, dt_bias = torch.randn(H, generator=g) * 0.5, torch.randn(H, K, generator=g)
    cu = torch.tensor([start, *(start + np.cumsum(lengths))], dtype=torch.int64)
    given = dict(q=q, k=k, v=v, g=raw, beta=beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu)
    func = load(kernel_path("kda_prepare_flashkda"), bind={"C": str(C)}).instance_for(given).func
    types = {a.name: a.ttype.dtype for a in func.args}
    args = {n: t.float().numpy().astype(types[n].np) if t.is_floating_point() else t.numpy()
            for n, t in given.items()}
    got, writers = run_tracked(func, args)
    want = kda_prepare_flashkda(q, k, v, raw, beta, A_log, dt_bias, cu, C=C)
    return got, writers, dict(zip(OUTPUTS, want)), cu.tolist()


@pytest.mark.parametrize("lengths, start", [
    ([0, 1, 15, 16, 17, 0, 33, 2, 31, 48, 5, 64, 0, 7, 16, 1, 40], 0),   # 17 sequences
    ([3] * 40 + [0] * 9 + [20], 0),                                        # 50, most far shorter than a chunk
    ([5, 16, 40], 37),      # the first starting past two chunks' worth of rows no sequence holds
])
def test_every_chunk_of_every_sequence_is_computed_once_and_right(lengths, start):
    got, writers, want, cu = prepared(lengths, start)
    T = cu[-1]
    in_sequence = np.zeros(T, dtype=bool)
    for bos, eos in zip(cu, cu[1:]):
        in_sequence[bos:eos] = True
    for name in ("w", "u", "qg", "kg", "aqk"):
        written = writers[name][0] >= 0                                # [T, H, D]
        assert written.all(axis=(1, 2))[in_sequence].all(), f"{name}: a row of a sequence was not written"
        assert not written.any(axis=(1, 2))[~in_sequence].any(), f"{name}: a row outside every sequence was written"
        a, b = got[name][0][in_sequence].astype(np.float64), want[name].numpy()[0][in_sequence]
        rel = np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-30)
        assert rel < 5e-3, f"{name}: relative RMSE {rel:.3g}"
    firsts = [t for bos, eos in zip(cu, cu[1:]) for t in range(bos, eos, C)]
    assert (writers["gend"][0][firsts] >= 0).all()                     # each chunk's first row
    np.testing.assert_allclose(got["gend"][0][firsts], want["gend"].numpy()[0][firsts], rtol=1e-4)


def slot_chunks(cu, C=C):
    """What each CTA slot computes under the scheme the kernel's comment states: (sequence, first
    token) for a slot with rows, from the bisection as written (floor(log2(N + 0.5)) + 1 halvings
    of [0, N), a slot's sequence the last whose first slot cu[n] // C + n is at most the slot)."""
    N, T = len(cu) - 1, cu[-1]
    steps = int(math.log2(float(np.float32(N) + np.float32(0.5)))) + 1
    got = {}
    for c in range((T + C - 1) // C + N):
        lo, hi = 0, N
        for _ in range(steps):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cu[mid] // C + mid <= c else (lo, mid)
        t = cu[lo] + (c - cu[lo] // C - lo) * C
        if cu[lo] <= t < cu[min(lo + 1, N)]:
            got.setdefault((lo, t), []).append(c)
    return got


@pytest.mark.parametrize("seed", range(40))
def test_the_slots_take_every_chunk_once_in_log2_n_steps(seed):
    """Over random batches (up to 300 sequences, many empty or shorter than a chunk, the first
    starting past row 0 in some): each chunk of each sequence has exactly one slot, within the
    kernel's grid; and the kernel's C writes the bisection, not a pass over every sequence."""
    rng = np.random.default_rng(seed)
    N = int(rng.integers(1, 300))
    lengths = rng.choice([0, 1, C - 1, C, C + 1, 2 * C + 3, int(rng.integers(0, 200))], size=N)
    cu = [int(x) for x in np.cumsum([int(rng.integers(0, 3 * C)) if seed % 2 else 0, *lengths])]
    got = slot_chunks(cu)
    want = {(n, t) for n in range(N) for t in range(cu[n], cu[n + 1], C)}
    assert set(got) == want and all(len(slots) == 1 for slots in got.values())


def test_the_kernel_searches_by_bisection():
    cu = compile_op(load_kfc("kernels/kda_prepare_flashkda.kfc", {"C": "16"}), parse_target("sm_90a"),
                    shape={"T": 4096, "K": 128, "V": 128}).kernel.cu
    assert re.search(r"log2f\(", cu) and not re.search(r"for \(long long \w+ = \w+; \w+ < dim_N;", cu)
