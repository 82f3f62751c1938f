"""Rows in registers against rows staged through shared memory, under tile choices around the
default (bf16, eager `triton.testing.do_bench`, kfc only):

    python -m bench.stage_sweep [rmsnorm,softmax,layernorm]

Prints, per shape, the six fastest variants and the register (`reg`) and default staged (`stg`)
figures in TB/s. It is what STAGED_BYTES_PER_CTA and STAGED_ELEMS_PER_THREAD in kfc.passes.tile
and DEFAULT_MIN_BYTES in kfc.passes.stage_rows were chosen from."""
import sys
import torch
from triton.testing import do_bench
import kfc

REG = "canonicalize,cse,dce,tile{%s},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
STG = "canonicalize,cse,dce,stage-rows{min_bytes=0},tile{%s},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
SHAPES = [(32768, 4096), (32768, 8192), (32768, 16384), (32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144)]
ops = sys.argv[1].split(",") if len(sys.argv) > 1 else ["rmsnorm"]


def variants_for(n):
    variants = {"reg": REG % "", "stg": STG % ""}
    for c in (1, 2, 4, 8, 16):
        for t in (128, 256, 512):
            if n * 2 / c > 200 * 1024 or n / (c * t) > 128 or n / (c * t) < 8:
                continue
            variants[f"stg c{c} t{t}"] = STG % f"threads={t},cluster={c}"
    return variants


from concurrent.futures import ThreadPoolExecutor
from kfc.frontend import load_kfc
from kfc.runtime.kernel import cached_compile
from kfc.model.target import parse_target

jobs = [(op, n, p) for op in ops for _, n in SHAPES for p in variants_for(n).values()]
specs = {op: load_kfc(f"kernels/{op}.kfc") for op in ops}


def build(job):
    op, n, p = job
    try:
        cached_compile(specs[op], parse_target("sm_90a"), p, {"N": n})
    except Exception as e:
        return str(e).splitlines()[0]


with ThreadPoolExecutor(16) as pool:
    fails = [f for f in pool.map(build, jobs) if f]
print(f"prebuilt {len(jobs)} ({len(fails)} failed)", fails[:3], flush=True)
for op in ops:
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda")
        args = (x, w) if op == "rmsnorm" else (x,)
        nbytes = 2 * x.numel() * 2 + (4 * n if op == "rmsnorm" else 0)
        variants = variants_for(n)
        res = []
        for name, pipe in variants.items():
            try:
                k = kfc.load(f"kernels/{op}.kfc", pipeline=pipe)
                out = torch.empty_like(x)
                k(*args, out=out)
                torch.cuda.synchronize()
                ms = do_bench(lambda: k(*args, out=out), warmup=5, rep=40)
                res.append((nbytes / ms / 1e9, name))
            except Exception as e:
                res.append((0.0, f"{name} ERR {str(e).splitlines()[0][:80]}"))
        res.sort(reverse=True)
        print(f"{op} {m}x{n}: " + " | ".join(f"{nm} {tb:.2f}" for tb, nm in res[:6]) +
              f" || reg {dict((nm, tb) for tb, nm in res)['reg']:.2f} stg {dict((nm, tb) for tb, nm in res)['stg']:.2f}", flush=True)
        del x
        torch.cuda.empty_cache()
