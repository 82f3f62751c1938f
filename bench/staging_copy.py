"""Who copies a staged row into shared memory: stage-rows{copy=bulk} (the default) against
stage-rows{copy=threads}, with QuACK timed in the same run (bf16, eager `triton.testing.do_bench`,
median of 3 interleaved rounds; every output checked against bench.rows.reference first):

    python -m bench.staging_copy [softmax,rmsnorm,layernorm]

Prints TB/s per shape and the ratios. It is what kept `bulk` the default of stage-rows
(bench/results/staging_copy_ab-20261202T1700Z.json, copy_ab; measured there by the same
steps before this module held them)."""
import statistics
import sys

import torch
import triton

import kfc
from bench import rows

PIPELINE = "canonicalize,cse,dce,stage-rows{copy=%s},tile,lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
SHAPES = [(32768, 8192), (32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144)]
COPIES = ("bulk", "threads")


def measure(op: str, gen) -> list:
    ref = rows.reference(op)
    kernels = {c: kfc.load(f"kernels/{op}.kfc", pipeline=PIPELINE % c, kb=False) for c in COPIES}
    quack = rows.quack(op)()
    table = []
    for m, n in SHAPES:
        args = rows.make_inputs(op, m, n, gen)
        want = ref(*args)
        fns = {"quack": lambda a=args: quack(*a)}
        for c, k in kernels.items():
            err = ((k(*args).float() - want).abs() / (want.abs() + 1e-2)).max().item()
            if not err < 2e-2:
                raise SystemExit(f"{op} {m}x{n} copy={c}: relative error {err:.3g}")
            fns[c] = lambda k=k, a=args: k(*a)
        times = {name: [] for name in fns}
        for _ in range(3):
            for name, f in fns.items():
                times[name].append(triton.testing.do_bench(f, warmup=25, rep=100))
        nbytes = rows.bytes_per_call(args)
        table.append((op, n, {name: nbytes / (statistics.median(t) * 1e-3) / 1e12 for name, t in times.items()}))
        del args, want
    return table


def main() -> None:
    ops = sys.argv[1].split(",") if len(sys.argv) > 1 else ["softmax", "rmsnorm", "layernorm"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("op        N        quack   bulk  threads  bulk/q threads/q threads/bulk")
    for op in ops:
        for op_, n, tb in measure(op, gen):
            print(f"{op_:9} {n:<8} {tb['quack']:.3f}  {tb['bulk']:.3f}  {tb['threads']:.3f}   "
                  f"{tb['bulk'] / tb['quack']:.3f}  {tb['threads'] / tb['quack']:.3f}   "
                  f"{tb['threads'] / tb['bulk']:.3f}", flush=True)


if __name__ == "__main__":
    main()
