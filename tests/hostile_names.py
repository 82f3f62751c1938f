"""Ops whose every user-chosen name is one that C++, CUDA or kfc's own generated code also uses:
keywords, CUDA built-ins, kfc's generated names and loop counters. Shared by the CPU test (the
emitted code compiles and names only prefixed parameters) and the GPU test (the results)."""

from __future__ import annotations

# names that, used raw in the emitted C++, would shadow or break something
HOSTILE = ["e", "i", "w", "c", "kfc_t", "kfc_m", "kfc_rowvalid", "kfc_lane", "dim_M", "v1", "s2", "float", "int",
           "new", "auto", "threadIdx", "blockIdx", "gridDim", "__syncthreads", "p_x", "nullptr", "kfc_kernel_sc"]


def scaled_op(x: str, s: str, y: str, m: str, n: str, local: str, name: str = "sc") -> str:
    """y = (x * s + 1) * s over rows, with a local value between, every name chosen by the caller."""
    return (f"op {name}({x}: f32[{m}, {n}], {s}: f32 = 3.0) -> ({y}: f32[{m}, {n}]) {{\n"
            f"  parallel row in 0..{m} {{\n"
            f"    {local} = {x}[row, :] * {s} + 1.0\n"
            f"    {y}[row, :] = {local} * {s}\n"
            f"  }}\n}}\n")


def norm_op(x: str, g: str, eps: str, y: str, m: str, n: str) -> str:
    """An rmsnorm with a weight, a scalar and a reduction, under the given names."""
    return (f"op nm({x}: f32[{m}, {n}], {g}: f32[{n}], {eps}: f32 = 1e-6) -> ({y}: f32[{m}, {n}]) {{\n"
            f"  parallel row in 0..{m} {{\n"
            f"    r = rsqrt(mean({x}[row, :] * {x}[row, :]) + {eps})\n"
            f"    {y}[row, :] = {x}[row, :] * r * {g}\n"
            f"  }}\n}}\n")


ROLES = ("x", "s", "y", "local", "m", "n")
NEUTRAL = {"x": "xin", "s": "alpha", "y": "out", "local": "t0", "m": "M", "n": "N", "g": "gain", "op": "sc"}


def source(case_id: str, names: dict[str, str]) -> str:
    """The op of a case with these names (role -> name; missing roles take the neutral name)."""
    nm = {**NEUTRAL, **names}
    if case_id == "norm":
        return norm_op(nm["x"], nm["g"], nm["s"], nm["y"], nm["m"], nm["n"])
    return scaled_op(nm["x"], nm["s"], nm["y"], nm["m"], nm["n"], nm["local"], nm["op"])


def cases() -> list[tuple[str, dict[str, str]]]:
    """(id, role -> name). Op k takes HOSTILE[k..k+5] as its input, scalar, output, local and two
    dims, so every name plays every role once; then a norm, and an op named like a PTX helper."""
    n = len(HOSTILE)
    out = [(f"op{k}-{HOSTILE[k]}", {r: HOSTILE[(k + j) % n] for j, r in enumerate(ROLES)}) for k in range(n)]
    out.append(("norm", {"x": "e", "g": "w", "s": "i", "y": "float", "m": "threadIdx", "n": "new"}))
    out.append(("kernel-name", {"op": "shfl_bfly"}))
    return out


def reference(case_id: str, inputs: dict, names: dict[str, str]):
    """The torch result of a case from its inputs by name (torch tensors; the scalar at its default)."""
    import torch

    nm = {**NEUTRAL, **names}
    x = inputs[nm["x"]].float()
    if case_id == "norm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * inputs[nm["g"]]
    return (x * 3.0 + 1.0) * 3.0
