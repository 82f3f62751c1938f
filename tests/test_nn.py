"""kfc.nn and kfc.ops without a GPU: the modules are torch's (constructor, state_dict), the
custom ops' fakes give the right shapes and dtypes on meta tensors, the generic registration
writes the op's torch schema, and bad inputs get one clear KfcError."""

import pytest
import torch

import kfc
import kfc.nn
from kfc.diagnostics import KfcError
from kfc.ops import schema


def test_modules_keep_torchs_constructor_and_state_dict():
    for ours, theirs, kw in [(kfc.nn.RMSNorm, torch.nn.RMSNorm, {"eps": 1e-5}),
                             (kfc.nn.LayerNorm, torch.nn.LayerNorm, {"bias": False}),
                             (kfc.nn.LayerNorm, torch.nn.LayerNorm, {"elementwise_affine": False})]:
        a, b = ours((4, 64), **kw), theirs((4, 64), **kw)
        assert isinstance(a, theirs)
        assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
        a.load_state_dict(b.state_dict())
        assert repr(a).split("(", 1)[1] == repr(b).split("(", 1)[1]


def test_fakes_on_meta_tensors():
    x = torch.empty(6, 300, device="meta", dtype=torch.bfloat16)
    w = torch.empty(300, device="meta")
    ops = torch.ops.kfc
    assert ops.rms_norm(x, w, 1e-6).shape == (6, 300)
    assert ops.rms_norm(x, w, 1e-6).dtype == torch.bfloat16
    y, res = ops.rms_norm_residual(x, x, w, 1e-6)
    assert y.shape == res.shape == (6, 300)
    dx, rstd, dw = ops.rms_norm_backward(x, w, x, None, 1e-6)
    assert dx.dtype == torch.bfloat16 and rstd.shape == (6,) and rstd.dtype == torch.float32
    assert dw.shape == (300,) and dw.dtype == torch.float32
    dx, mean, rstd, dw, db = ops.layer_norm_backward(x, w, x, 1e-5)
    assert mean.shape == rstd.shape == (6,) and dw.shape == db.shape == (300,) and db.dtype == torch.float32
    assert ops.softmax_lastdim(x).shape == (6, 300)
    assert ops.softmax_backward(x, x).dtype == torch.bfloat16


def test_the_schema_of_a_kfc_op():
    assert schema(kfc.load("kernels/rmsnorm.kfc")) == "(Tensor x, Tensor w, float eps=1e-06) -> Tensor"
    assert schema(kfc.load("kernels/rmsnorm_bwd_dx.kfc")) == \
        "(Tensor x, Tensor w, Tensor dy, Tensor? dres, float eps=1e-06) -> (Tensor, Tensor, Tensor)"


def test_a_generic_op_registers_once_and_its_fake_follows_the_instance():
    k = kfc.load("kernels/softmax_bwd.kfc")
    op = kfc.ops.register(k)
    assert kfc.ops.register(k) is op
    y = torch.empty(3, 17, device="meta", dtype=torch.float16)
    assert op(y, y).dtype == torch.float16 and op(y, y).shape == (3, 17)
    with pytest.raises(KfcError, match="already registered for another op"):
        kfc.ops.register(kfc.load("kernels/softmax.kfc"), name="softmax_bwd")


def test_bad_inputs_get_one_clear_error():
    F = kfc.nn.functional
    with pytest.raises(KfcError, match="kfc's kernels take bfloat16, float16 or float32"):
        F.rms_norm(torch.zeros(2, 8, dtype=torch.float64), (8,))
    with pytest.raises(KfcError, match="does not end in normalized_shape"):
        F.layer_norm(torch.zeros(2, 8), (4,))
    with pytest.raises(KfcError, match="weight has 4 elements"):
        F.rms_norm(torch.zeros(2, 8), (8,), torch.ones(4))
    with pytest.raises(KfcError, match="residual has shape"):
        F.rms_norm(torch.zeros(2, 8), (8,), residual=torch.zeros(2, 4))
    with pytest.raises(KfcError, match="kernels run on the GPU"):
        with torch.no_grad():
            F.softmax(torch.randn(2, 8))
