"""The launch fast path's C structures and constants match cuda.h: compiled and run on the host
(no GPU), the toolkit's own sizeof/offsetof and enum values must equal what kfc.runtime.launcher
uses through ctypes."""

import ctypes
import subprocess

from kfc.codegen.toolchain import find_toolchain
from kfc.runtime import launcher

PROBE = r"""
#include <cuda.h>
#include <cstddef>
#include <cstdio>
int main() {
  std::printf("%zu %zu %zu %zu %zu %zu %zu %d %d %d\n", sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream),
              offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs), sizeof(CUlaunchAttribute),
              offsetof(CUlaunchAttribute, value), sizeof(CUlaunchAttributeValue),
              (int)CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (int)CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
              (int)CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
  return 0;
}
"""


def test_the_launch_structures_have_cuda_h_layout(tmp_path):
    src = tmp_path / "probe.cu"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run([find_toolchain().nvcc, str(src), "-o", str(exe)], check=True, capture_output=True, timeout=300)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    cfg, attr = launcher._LaunchConfig, launcher._LaunchAttribute
    assert got == [ctypes.sizeof(cfg), cfg.hStream.offset, cfg.attrs.offset, cfg.numAttrs.offset,
                   ctypes.sizeof(attr), attr.value.offset, ctypes.sizeof(launcher._AttrValue),
                   launcher.CLUSTER_DIMENSION, launcher.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                   launcher.NON_PORTABLE_CLUSTER_SIZE_ALLOWED]


def test_argument_slots_point_at_their_values():
    slots = launcher.ArgSlots([ctypes.c_void_p, ctypes.c_float, ctypes.c_longlong])
    slots.values[0].value, slots.values[1].value, slots.values[2].value = 0x1234560, 2.5, -7
    arr = (ctypes.c_void_p * 3).from_address(slots.address)
    assert ctypes.c_void_p.from_address(arr[0]).value == 0x1234560
    assert ctypes.c_float.from_address(arr[1]).value == 2.5
    assert ctypes.c_longlong.from_address(arr[2]).value == -7
