"""The headers kfc's own builds give nvcc instead of all of cuda_runtime.h.

nvcc force-includes cuda_runtime.h into every translation unit: 1.3 MB of text, most of it the
host runtime API and <cmath> that a kfc kernel never calls. Preprocessing and parsing it is about
0.25 s of every `nvcc -ptx`, whatever the kernel (an empty kernel costs as much as a GEMM), and it
is most of what a compile test waits for. Generated kernels use a few device intrinsics (bit
casts, fma, shuffles, `__cvta_generic_to_shared`, `__ldg`, barriers) and a handful of libdevice
math functions, so a build defines `__CUDA_RUNTIME_H__` (cuda_runtime.h's include guard: it
reads as empty) and includes PRELUDE instead: NVIDIA's device-function and intrinsic headers,
plus declarations of the math builtins kfc emits, with the attributes CUDA's math header gives
them, so cicc maps each to the same libdevice function.

The PTX is the same as a build with the full headers (tests/test_nvcc_prelude.py compares the two
on kernels of every kind; `KFC_NVCC_HEADERS=check` compares them on every build). A kernel whose
code needs anything else fails to compile against the prelude and is built again with the full
headers. A call the prelude resolves resolves as CUDA's headers do, never to another overload:
min and max are declared for two ints and for two long longs only, so arguments that are both
int (or promote to int) or both long long pick the function CUDA picks, and any other mix
(unsigned, long, int with long long, float) is ambiguous here and falls back. Where a kernel
fails against the prelude and a trivial probe kernel fails too, the toolchain is not the one the
prelude fits (another CUDA release's headers), and that nvcc's later kernels take the full
headers at once. The .cu that `kfc compile` writes is unchanged: a user's plain nvcc builds it
with the full headers.
"""

from __future__ import annotations

import os

from ..diagnostics import KfcError

ENV = "KFC_NVCC_HEADERS"
MODES = ("light", "full", "check")

# float builtins kfc's elementwise rules emit; each maps to libdevice's __nv_<name>
_UNARY = ("expf", "exp2f", "logf", "log2f", "log1pf", "sqrtf", "fabsf", "tanhf", "rintf", "floorf")

PRELUDE = "\n".join([
    "// kfc: the device side of cuda_runtime.h that generated kernels use (kfc/codegen/nvcc_prelude.py)",
    "#define __CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__",
    "#include <crt/host_defines.h>",
    "#include <device_launch_parameters.h>",
    "#include <vector_functions.h>",
    "#include <crt/device_functions.h>",
    "#include <sm_20_intrinsics.h>",
    "#include <sm_30_intrinsics.h>",
    "#include <sm_32_intrinsics.h>",
    "#undef __CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__",
    'extern "C" {',
    *(f"extern __host__ __device__ __device_builtin__ float {f}(float) throw();" for f in _UNARY),
    "extern __host__ __device__ __device_builtin__ float powf(float, float) throw();",
    "extern __host__ __device__ __device_builtin__ float fmaf(float, float, float) throw();",
    "extern __host__ __device__ __device_builtin__ int min(const int, const int);",
    "extern __host__ __device__ __device_builtin__ int max(const int, const int);",
    "extern __host__ __device__ __device_builtin__ long long llmin(const long long, const long long);",
    "extern __host__ __device__ __device_builtin__ long long llmax(const long long, const long long);",
    "}",
    "static inline __host__ __device__ long long min(const long long a, const long long b) { return llmin(a, b); }",
    "static inline __host__ __device__ long long max(const long long a, const long long b) { return llmax(a, b); }",
    "",
])

# cuda_runtime.h's include guard: nvcc's forced include of it then adds nothing
FLAGS = ("-D__CUDA_RUNTIME_H__",)


def mode() -> str:
    """How kfc builds: `light` (the prelude, the full headers where it does not compile; the
    default), `full` (always the full headers) or `check` (both, and an internal error where
    their PTX differs)."""
    chosen = os.environ.get(ENV) or "light"
    if chosen not in MODES:
        raise KfcError(f"{ENV}={chosen} is not a way kfc builds",
                       hint=f"set {ENV} to one of {', '.join(MODES)}, or unset it")
    return chosen
