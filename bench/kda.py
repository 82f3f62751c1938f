"""Kimi Delta Attention's forward: kfc against FlashKDA and fla, in one run on one GPU.

    python -m bench.kda [--cases T=8192:H=96,varlen=1300+547+2048:H=96,...] [--chunks 16,32,64]
                        [--state none|f32|bf16] [--workspaces f32,bf16] [--one-kernel]
                        [--fla] [--parts] [--codegen TILE_COLUMN_REGISTERS=True,...] [--out FILE]

FlashKDA's interface (its benchmark's): B = 1, K = V = 128, bf16 q, k, v, raw gates and beta
logits, the gate lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) with lower_bound -5, q and k
L2-normalised in the kernel, states V-first. Contenders: `flashkda` (flash_kda.fwd, where it
imports: build it with ../shared/peers/flashkda.sh), `fla` (fla's chunk_kda with
use_gate_in_kernel, safe_gate, use_qk_l2norm_in_kernel and use_beta_sigmoid_in_kernel, its state
[K, V]-first) and `kfc[C=..]` (kfc.nn.kda.flash_kda_fwd at each chunk: the prepare kernel and the
recurrence; with --one-kernel also `kfc[C=..,one kernel]`, kernels/kda_fwd_flashkda.kfc alone;
with --fla also `kfc chunk_kda[C=16,pair]` and `[C=16,one kernel]`, kfc.nn.kda.chunk_kda called
as fla is, split and not). Every contender's o (and final state) is first checked against the float64 recurrence
(kfc.reference.kda.kda_flashkda): relative RMSE within 2e-2, a wrong contender is not timed and
the run exits non-zero; the error is recorded. Timing: eager, triton.testing.do_bench median with
the L2 flushed before each call (the headline); CUDA graph, do_bench_cudagraph median, beside it.
`speedup_vs_<peer>` = the peer's eager time / kfc's best chunk's (> 1: kfc faster), among the
`kfc[C=..]` contenders (FlashKDA's interface). --parts
also times each kernel a kfc contender launches alone, eager (`parts_eager_ms`: the prepare
kernel and the recurrence apart).
--codegen sets kfc.codegen.cuda's switches for the run (every kfc contender is built with them;
the JIT cache keys on them), recorded in the result: two runs, each with the peers, A/B a switch.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import sys
from pathlib import Path

from kfc.check.tolerance import compare_arrays

from . import harness
from .provenance import save

CASES = ["T=8192:H=96", "T=8192:H=64", "varlen=1300+547+2048+963+271+3063:H=96", "varlen=8x1024:H=96"]
K = V = 128
LOWER_BOUND = -5.0
TOL = 2e-2  # relative RMSE against the float64 recurrence; FlashKDA computes in bf16 on tensor cores


def parse_case(text: str) -> tuple[list[int], int]:
    """'T=8192:H=96' -> ([8192], 96); 'varlen=1300+547:H=96' -> ([1300, 547], 96); 'varlen=8x1024:H=96'."""
    fields = dict(part.split("=", 1) for part in text.split(":"))
    if "T" in fields:
        lengths = [int(fields["T"])]
    else:
        spec = fields["varlen"]
        lengths = ([int(spec.split("x")[1])] * int(spec.split("x")[0]) if "x" in spec
                   else [int(x) for x in spec.split("+")])
    return lengths, int(fields["H"])


def inputs(lengths: list[int], H: int, state: str, seed: int = 0):
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lengths)
    unit = lambda: F.normalize(torch.randn(1, T, H, K, device="cuda", generator=g), dim=-1).bfloat16()  # noqa: E731
    x = dict(q=unit(), k=unit(), v=torch.randn(1, T, H, V, device="cuda", generator=g).bfloat16(),
             g=torch.randn(1, T, H, K, device="cuda", generator=g).bfloat16(),
             beta=torch.randn(1, T, H, device="cuda", generator=g).bfloat16(),
             A_log=torch.rand(H, device="cuda", generator=g), dt_bias=torch.rand(H, K, device="cuda", generator=g),
             cu_seqlens=torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64, device="cuda"))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}.get(state)
    x["h0"] = None if dtype is None else (torch.randn(len(lengths), H, V, K, device="cuda", generator=g) * 0.1).to(dtype)
    return x


WORKSPACES = {"f32": "float32", "bf16": "bfloat16"}


def contenders(x: dict, chunks: list[int], one_kernel: bool = False, workspaces: tuple[str, ...] = ("f32",),
               fla_interface: bool = False) -> dict:
    """name -> a call returning (o, final state V-first or None), or a string saying why it is absent."""
    import torch

    import kfc.nn.kda as kda

    scale = K ** -0.5
    out = torch.empty_like(x["v"])
    final = None if x["h0"] is None else torch.empty_like(x["h0"])
    calls: dict = {}

    for c, split, ws in itertools.product(chunks, (True, False) if one_kernel else (True,), workspaces):
        if not split and ws != workspaces[0]:  # the one kernel has no workspaces
            continue

        def kfc_call(c=c, split=split, ws=ws):
            kfc_out = torch.empty_like(x["v"])
            kfc_final = None if x["h0"] is None else torch.empty_like(x["h0"])

            def call():
                kda.flash_kda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, kfc_out, x["A_log"], x["dt_bias"],
                                  LOWER_BOUND, initial_state=x["h0"], final_state=kfc_final,
                                  cu_seqlens=x["cu_seqlens"], chunk_size=c, split=split,
                                  workspace=getattr(torch, WORKSPACES[ws]))
                return kfc_out, kfc_final
            return call
        tag = "" if not split or ws == "f32" else f",{ws} workspaces"
        calls[f"kfc[C={c}{tag}]" if split else f"kfc[C={c},one kernel]"] = harness.safe(kfc_call)

    def flashkda():
        import flash_kda

        def call():
            flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, out, x["A_log"], x["dt_bias"], LOWER_BOUND,
                          initial_state=x["h0"], final_state=final, cu_seqlens=x["cu_seqlens"])
            return out, final
        return call
    calls["flashkda"] = harness.safe(flashkda)

    def in_flas_interface(chunk_kda, **extra):
        """A call of an fla-interface chunk_kda in FlashKDA's gate mode, its state [K, V]-first."""
        h0 = None if x["h0"] is None else x["h0"].float().transpose(-1, -2).contiguous()  # fla: f32 [K, V]

        def call():
            o, ht = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale, initial_state=h0,
                              output_final_state=h0 is not None, use_qk_l2norm_in_kernel=True,
                              use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"].reshape(-1),
                              safe_gate=True, lower_bound=LOWER_BOUND, use_beta_sigmoid_in_kernel=True,
                              cu_seqlens=x["cu_seqlens"], **extra)
            return o, None if ht is None else ht.transpose(-1, -2)
        return call

    for split in (True, False) if fla_interface else ():
        label = "kfc chunk_kda[C=16" + (",pair]" if split else ",one kernel]")
        calls[label] = harness.safe(lambda split=split: in_flas_interface(kda.chunk_kda, split=split))

    def fla():
        from fla.ops.kda import chunk_kda

        return in_flas_interface(chunk_kda)
    calls["fla"] = harness.safe(fla)
    return calls


def kernel_launches(call) -> list[tuple[str, object]]:
    """The kernels a kfc call launches (through kfc.nn.kda.run), in order, each as (its name and
    bindings, a call that launches it alone again on the same tensors): the split pair's prepare
    kernel and recurrence, timed apart."""
    import kfc.nn.kda as kda

    launches, launch = [], kda.run

    def recorded(name, bind, given, outs, pipeline=None):
        launch(name, bind, given, outs, pipeline)
        label = name + "[" + ",".join(f"{k}={v}" for k, v in bind.items()) + "]"
        launches.append((label, lambda: launch(name, bind, given, outs, pipeline)))

    kda.run = recorded
    try:
        call()
    finally:
        kda.run = launch
    return launches


def run(cases: list[str], chunks: list[int], state: str, progress=None, one_kernel: bool = False,
        workspaces: tuple[str, ...] = ("f32",), parts: bool = False,
        fla_interface: bool = False) -> tuple[list[dict], list[str]]:
    """Each case's row (contenders checked, then timed; with `parts`, each kernel of a kfc
    contender timed alone too, eager) and the failures; `progress(rows, failures)` after each
    case, so a run stopped part-way keeps what it measured."""
    import torch
    from triton.testing import do_bench_cudagraph

    from kfc.reference.kda import kda_flashkda

    rows, failures = [], []
    for case in cases:
        lengths, H = parse_case(case)
        x = inputs(lengths, H, state)
        with torch.no_grad():
            want_o, want_ht = kda_flashkda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"],
                                           x["cu_seqlens"], h0=x["h0"], scale=K ** -0.5, lower_bound=LOWER_BOUND)
        row: dict = {"case": case, "T": sum(lengths), "H": H, "sequences": len(lengths), "state": state}
        for name, call in contenders(x, chunks, one_kernel, workspaces, fla_interface).items():
            if isinstance(call, str):
                row[name] = {"ok": False, "error": call}
                continue
            try:
                with torch.no_grad():
                    o, ht = call()
                    torch.cuda.synchronize()
                    errors = {"o": off(o, want_o)}
                    if ht is not None:
                        errors["ht"] = off(ht, want_ht)
                    problem = "; ".join(f"{k}: {v}" for k, v in errors.items() if v)
                    if problem:
                        row[name] = {"ok": False, "error": f"wrong before timing: {problem}"}
                        failures.append(f"{case} {name}: {problem}")
                        continue
                    rel = compare_arrays(o.float(), want_o.float(), TOL).rel_rmse
                    eager = harness.time_eager(call, ())
                    graph = do_bench_cudagraph(call, rep=100, return_mode="median") * 1e3
                row[name] = {"ok": True, "rel_rmse_o": rel, "eager_ms": eager / 1e3, "graph_ms": graph / 1e3}
                if parts and name.startswith("kfc"):
                    with torch.no_grad():
                        row[name]["parts_eager_ms"] = {label: harness.time_eager(again, ()) / 1e3
                                                       for label, again in kernel_launches(call)}
            except Exception as e:  # noqa: BLE001 - a failing contender is a result, not a crash
                row[name] = harness.failed(e)
                failures.append(f"{case} {name}: {row[name]['error']}")
        # FlashKDA's interface's best (kfc[C=..]); the fla interface's contenders are shown beside it
        timed = [(v["eager_ms"], k) for k, v in row.items() if k.startswith("kfc[") and v.get("ok")]
        if timed:
            kfc_best = min(timed)
            row["kfc_best"] = kfc_best[1]
            for peer in ("flashkda", "fla"):
                if row.get(peer, {}).get("ok"):
                    row[f"speedup_vs_{peer}_eager"] = row[peer]["eager_ms"] / kfc_best[0]
        rows.append(row)
        print(line(row), flush=True)
        if progress is not None:
            progress(rows, failures)
    return rows, failures


def set_codegen(text: str) -> str:
    """Set kfc.codegen.cuda's switches from NAME=VALUE,... (Python literals); the switches as set
    now. A name that is no switch is a ValueError naming those that are."""
    from kfc.codegen import cuda

    for item in filter(None, (text or "").split(",")):
        name, _, value = item.partition("=")
        if name not in cuda.SWITCHES:
            raise ValueError(f"{name!r} is no switch of kfc.codegen.cuda; the switches: {', '.join(cuda.SWITCHES)}")
        try:
            setattr(cuda, name, ast.literal_eval(value))
        except (ValueError, SyntaxError):
            raise ValueError(f"{item!r}: the value must be a Python literal (True, False, None, 2)") from None
    return cuda.switches()


def off(out, ref) -> str:
    """What is wrong with an output by the benchmark's rule ("" when it holds): every element
    finite where the reference is, the relative RMSE within TOL. Not element by element: FlashKDA's
    bf16 products leave single elements 8% off (worst 0.084 of |ref| + rms at T=8192, H=96) with a
    relative RMSE of 5e-3 (measured on an H100), and fla's tests judge by such a ratio too
    (fla.utils.assert_close)."""
    c = compare_arrays(out.float(), ref.float(), TOL)
    if c.shape_mismatch or c.unwritten or c.special_mismatch or c.rel_rmse > TOL:
        return c.shape_mismatch or f"rel RMSE {c.rel_rmse:.3g}, {c.unwritten + c.special_mismatch} not finite"
    return ""


def line(row: dict) -> str:
    cells = []
    for k, v in row.items():
        if isinstance(v, dict):
            cells.append(f"{k} {v['eager_ms']:.3f} ms ({v['graph_ms']:.3f} graph)" if v.get("ok") else f"{k} -")
    return f"{row['case']}: " + ", ".join(cells)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kda", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", help="comma-separated T=..:H=.. or varlen=a+b+..:H=.. (or varlen=NxL:H=..); "
                                    "default: " + ",".join(CASES))
    ap.add_argument("--chunks", default="16,32,64", help="kfc's chunk sizes to time, each a contender (default 16,32,64)")
    ap.add_argument("--state", choices=["none", "f32", "bf16"], default="none",
                    help="the initial and final state: absent (the default, FlashKDA's headline) or in this dtype")
    ap.add_argument("--workspaces", default="f32",
                    help="the split pair's workspace dtypes, each a contender: f32 (the default), bf16 "
                         "(half the traffic between the kernels) or f32,bf16")
    ap.add_argument("--one-kernel", action="store_true",
                    help="also time kfc's single kernel per (sequence, head) at each chunk, beside the split pair")
    ap.add_argument("--fla", action="store_true",
                    help="also time kfc's fla interface (kfc.nn.kda.chunk_kda, chunk 16) as fla is called: "
                         "its split pair and its one kernel")
    ap.add_argument("--parts", action="store_true",
                    help="also time each kernel of a kfc contender alone (the prepare kernel and the recurrence)")
    ap.add_argument("--codegen", default="",
                    help="kfc.codegen.cuda's switches for this run, NAME=VALUE,... (e.g. TILE_COLUMN_REGISTERS=True)")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    try:
        codegen = set_codegen(args.codegen)
    except ValueError as e:
        ap.error(str(e))
    cases = args.cases.split(",") if args.cases else CASES
    chunks = [int(c) for c in args.chunks.split(",")]
    prov = harness.provenance(["fla-core", "flash_kda"])

    def payload(rows, failures):
        return {"op": "kda forward, FlashKDA's interface", "dtype": "bf16 inputs and o; K = V = 128",
                "state": args.state,
                "check": f"relative RMSE of o (and the final state) to the float64 recurrence < {TOL}",
                "timing": "eager: triton.testing.do_bench median, L2 flushed before each call; "
                          "graph: triton.testing.do_bench_cudagraph median",
                "speedup": "peer eager time / kfc's best chunk's eager time (> 1: kfc faster)",
                "codegen": codegen, "env": prov, "cases": rows, "failures": failures}

    def progress(rows, failures):
        if args.out:
            Path(args.out).write_text(json.dumps({"partial": True, **payload(rows, failures)}, indent=2, default=str))
    workspaces = tuple(args.workspaces.split(","))
    if not set(workspaces) <= set(WORKSPACES):
        ap.error(f"--workspaces takes {', '.join(WORKSPACES)}, not {args.workspaces}")
    rows, failures = run(cases, chunks, args.state, progress, args.one_kernel, workspaces, args.parts, args.fla)
    path = save("kda", payload(rows, failures), also=args.out)
    print(f"saved {path}")
    names = [k for k in rows[0] if isinstance(rows[0][k], dict)] if rows else []
    print(f"\nKDA forward on {prov.get('gpu', '?')}: eager ms (CUDA graph ms)")
    print("| case | " + " | ".join(names) + " | kfc best vs FlashKDA | vs fla |")
    print("|---" * (len(names) + 3) + "|")
    for r in rows:
        cells = [f"{r[n]['eager_ms']:.3f} ({r[n]['graph_ms']:.3f})" if r[n].get("ok") else "-" for n in names]
        sp = [f"{r[k]:.3f}x" if k in r else "-" for k in ("speedup_vs_flashkda_eager", "speedup_vs_fla_eager")]
        print(f"| {r['case']} | " + " | ".join(cells) + " | " + " | ".join(sp) + " |")
    for r in rows:
        for n in names:
            for label, ms in r[n].get("parts_eager_ms", {}).items():
                print(f"  {r['case']} {n}: {label} {ms:.3f} ms eager")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
