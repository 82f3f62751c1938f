"""TMA tensor maps on the CPU: the layout cuTensorMapEncodeTiled is given and the tensors it
refuses, the contract entry, the 64-byte aligned argument slot, the cache of encodings (the
driver's encoder replaced), a prepared call filling its slot, and a package refusing them."""

import ctypes
import json
import shutil
import sys
import types

import pytest

from kfc.codegen.c_names import KernelParam
from kfc.diagnostics import KfcError
from kfc.runtime import contract, tensor_maps
from kfc.runtime.calls import MISS, PreparedCall, Stage
from kfc.runtime.launcher import ArgSlots, TensorMapSlot
from kfc.runtime.tensor_maps import TiledLayout, tiled_layout

MAP = {"name": "a", "kind": "tensor_map", "ctype": "kfc_tensor_map", "dtype": "bf16", "optional": False,
       "is_output": False, "box": [128, 64], "swizzle": 128}


def test_a_row_major_tensor_is_described_innermost_first():
    assert tiled_layout("op: 'a'", "bf16", (300, 256), (256, 1), 0x1000, (128, 64), 128) == \
        TiledLayout((256, 300), (512,), (64, 128))
    # rows further apart than their length (a padded pitch), f32
    assert tiled_layout("op: 'b'", "f32", (5, 60), (64, 1), 0x2000, (8, 32), 128) == \
        TiledLayout((60, 5), (256,), (32, 8))
    # one row: torch leaves its stride arbitrary, and it is never stepped over
    assert tiled_layout("op: 'c'", "bf16", (1, 100), (7, 1), 0, (64, 64), 128).global_strides == (208,)


@pytest.mark.parametrize("dtype,shape,strides,ptr,box,swizzle,message", [
    ("bf16", (4, 8, 8), (64, 8, 1), 0, (8, 8), 0, "'a' is rank 3"),
    ("bf16", (64, 64), (1, 64), 0, (64, 64), 128, "(?s)unit stride.*contiguous"),
    ("bf16", (64, 100), (100, 1), 0, (64, 64), 128, "(?s)200 bytes apart.*multiple of 8 bf16 elements"),
    ("f32", (64, 30), (30, 1), 0, (64, 32), 128, "(?s)120 bytes apart.*multiple of 4 f32 elements"),
    ("bf16", (64, 64), (64, 1), 0x1008, (64, 64), 128, "not 16-byte aligned"),
    ("bf16", (0, 64), (64, 1), 0, (64, 64), 128, "empty"),
    ("i32", (64, 64), (64, 1), 0, (64, 64), 128, "tensor map of i32"),
    ("bf16", (64, 64), (64, 1), 0, (64, 64), 64, "box \\[64, 64\\] with swizzle 64"),  # a 128-byte box row
    ("bf16", (64, 64), (64, 1), 0, (64, 64), 16, "swizzle 16"),
    ("bf16", (64, 64), (64, 1), 0, (512, 64), 0, "box \\[512, 64\\]"),
    ("bf16", (64, 64), (64, 1), 0, (64, 4), 0, "box \\[64, 4\\]"),  # 8 bytes a box row
])
def test_what_a_tensor_map_cannot_take_is_refused_by_name(dtype, shape, strides, ptr, box, swizzle, message):
    with pytest.raises(KfcError, match=message) as e:
        tiled_layout("op: 'a'", dtype, shape, strides, ptr, box, swizzle)
    assert "op: 'a'" in str(e.value)


def test_the_contract_lists_box_and_swizzle_for_tensor_maps_only():
    p = KernelParam("a", "tensor_map", "kfc_tensor_map", "bf16", box=(128, 64), swizzle=128)
    assert p.contract() == MAP
    assert KernelParam("a", "tensor", "const kfc_bf16*", "bf16").contract() == \
        {"name": "a", "kind": "tensor", "ctype": "const kfc_bf16*", "dtype": "bf16", "optional": False,
         "is_output": False}
    assert "box" not in KernelParam("kfc_ws0", "workspace", "float*", "f32", shape=("M",)).contract()
    kernel = {"name": "k", "grid": ["1", "1", "1"], "params": [dict(MAP, name="a"), {"name": "a", "kind": "tensor"}]}
    assert contract.single_kernel({"kernels": [kernel]}, "op") is kernel


def test_a_tensor_map_slot_is_128_bytes_at_a_64_byte_boundary():
    slots = ArgSlots([ctypes.c_char, TensorMapSlot, ctypes.c_void_p, TensorMapSlot])
    for k in (1, 3):
        slot = slots.values[k]
        assert slot.address % 64 == 0 and slots.array[k] == slot.address
        slot.fill(bytes(range(128)))
        assert ctypes.string_at(slot.address, 128) == bytes(range(128))
        slot.fill(None)
        assert ctypes.string_at(slot.address, 128) == bytes(128)
    assert slots.array[2] == ctypes.addressof(slots.values[2])


class FakeTensor:
    def __init__(self, ptr, shape, strides, dtype="bfloat16", element_size=2, device=0):
        self.ptr, self.shape, self.strides, self.dtype, self.size, self.device = \
            ptr, shape, strides, dtype, element_size, device

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self.strides

    def element_size(self):
        return self.size

    def get_device(self):
        return self.device

    def is_contiguous(self):
        return self.strides == (self.shape[1], 1)


@pytest.fixture
def encoded(monkeypatch):
    """The driver's encoder replaced: the calls it gets, and bytes that tell them apart."""
    calls = []

    def encode(what, dtype, ptr, layout, swizzle):
        calls.append((what, dtype, ptr, layout, swizzle))
        return len(calls).to_bytes(1, "little") * 128

    monkeypatch.setattr(tensor_maps, "encode", encode)
    return calls


def test_encodings_are_kept_by_what_fixes_them(encoded):
    cache = tensor_maps.Encodings(limit=2)
    a = FakeTensor(0x1000, (300, 256), (256, 1))
    assert cache.get("op: 'a'", a, MAP) == b"\x01" * 128
    assert cache.get("op: 'a'", FakeTensor(0x1000, (300, 256), (256, 1)), MAP) == b"\x01" * 128
    assert encoded == [("op: 'a'", "bf16", 0x1000, TiledLayout((256, 300), (512,), (64, 128)), 128)]
    for other, param in ((FakeTensor(0x2000, (300, 256), (256, 1)), MAP),
                         (FakeTensor(0x1000, (300, 256), (256, 1), device=1), MAP),
                         (a, dict(MAP, swizzle=64, box=[128, 32]))):
        cache.get("op: 'a'", other, param)
    assert len(encoded) == 4
    cache.get("op: 'a'", a, MAP)  # pushed out by the two after it
    assert len(encoded) == 5
    with pytest.raises(KfcError, match="'a' is float32; its tensor map is of bf16"):
        cache.get("op: 'a'", FakeTensor(0x3000, (8, 64), (64, 1), "float32", 4), MAP)
    with pytest.raises(KfcError, match="pad the row to a multiple of 8 bf16"):
        cache.get("op: 'a'", FakeTensor(0x3000, (8, 100), (100, 1)), MAP)


class FakeLaunch:
    name = "kfc_kernel_op"

    def __init__(self, slot_types):
        self.slots = ArgSlots(slot_types)
        self.launched = []

    def launch(self):
        self.launched.append(ctypes.string_at(self.slots.values[1].address, 128))


def _call(maps, runs=True):
    launch = FakeLaunch([ctypes.c_void_p, TensorMapSlot])
    stage = Stage(launch, [0, None], {}, [(0, "a", 0)], [], [], [], maps, [], runs)
    return PreparedCall(stage, [], outputs_given=True), launch


def test_a_prepared_call_encodes_its_tensor_maps_and_takes_the_python_path(encoded):
    call, launch = _call([(0, 1, MAP, "op: 'a'")])
    assert not call.can_be_native((FakeTensor(0x1000, (64, 64), (64, 1)),), None)
    assert call.call((FakeTensor(0x1000, (64, 64), (64, 1)),), []) == ()
    assert call.call((FakeTensor(0x2000, (64, 64), (64, 1)),), []) == ()
    assert launch.launched == [b"\x01" * 128, b"\x02" * 128] and launch.slots.values[0].value == 0x2000
    # what the fast path cannot check goes the full way, which says what is wrong
    assert call.call((FakeTensor(0x1000, (64, 64), (128, 1)),), []) is MISS
    assert len(launch.launched) == 2
    without, _ = _call([])
    assert without.can_be_native((FakeTensor(0x1000, (64, 64), (64, 1)),), None)


def test_an_output_stored_through_a_tensor_map_has_its_map_encoded_from_the_output(encoded):
    """A TMA-store epilogue's map describes the output the call writes: encoded per call from
    the output given (or allocated), after its pointer slot is filled."""
    launch = FakeLaunch([ctypes.c_void_p, TensorMapSlot])
    out_map = {**MAP, "name": "c", "is_output": True, "box": [64, 64]}
    stage = Stage(launch, [0, None], {}, [], [], [("c", 0)], [], [], [(0, 1, out_map, "op: 'c'")], True)
    call = PreparedCall(stage, [], outputs_given=True)
    assert not call.can_be_native((), [FakeTensor(0x4000, (64, 64), (64, 1))])
    call.call((), [FakeTensor(0x4000, (64, 64), (64, 1))])
    assert launch.slots.values[0].value == 0x4000 and launch.launched == [b"\x01" * 128]
    assert encoded[0][0] == "op: 'c'" and encoded[0][2] == 0x4000 and encoded[0][3].box_dim == (64, 64)


def test_an_empty_grid_encodes_nothing(encoded):
    call, launch = _call([(0, 1, MAP, "op: 'a'")], runs=False)
    call.call((FakeTensor(0, (0, 64), (64, 1)),), [])
    assert encoded == [] and launch.launched == []


def test_a_package_refuses_tensor_maps_by_name(tmp_path, monkeypatch):
    from kfc.package import build

    pkg = tmp_path / "tmapkg"
    pkg.mkdir()
    for name in build.RUNTIME_FILES:
        shutil.copyfile(build.RUNTIME / name, pkg / name)
    shutil.copyfile(build.HERE / "standalone.py", pkg / "_op.py")
    (pkg / "__init__.py").write_text("")
    (pkg / "op.json").write_text(json.dumps({"op": "gemm", "inputs": [{"name": "a", "kind": "tensor"}],
                                             "outputs": []}))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tmapkg", raising=False)
    from tmapkg import _op

    op = _op.Op(pkg)
    op._native = False  # no compiled launcher: nothing to build here
    kernel = {"cubin": "k.cubin", "kernels": [{"name": "k", "params": [MAP, dict(MAP, kind="tensor")]}]}
    with pytest.raises(_op.OpError, match="gemm: .*'a'.*packages cannot launch TMA kernels yet"):
        op.prepare(kernel, {}, {"a": types.SimpleNamespace()}, {}, 0)
