"""The gate's reference on the GPU: it runs in its own child process and reads the inputs in
place through CUDA IPC, writing its results into buffers kfc shared. Run with `pytest -m gpu`."""

import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


def test_the_gate_reference_runs_in_a_child_on_the_gpu_and_is_exact():
    requires_gpu()
    import os

    from kfc.check.sandbox import shared_sandbox
    from kfc.factory.problem import op_problem
    from kfc.frontend import load_kfc

    spec = load_kfc("kernels/rmsnorm.kfc")
    problem = op_problem(spec)
    dims = {"M": 32768, "N": 4096}
    x, w, eps = problem.make_inputs(dims, 11, 1.0)
    [ref] = problem.reference(x, w, eps)
    direct = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype).float()
    assert ref.is_cuda and ref.dtype == torch.float32 and torch.equal(ref, direct)
    box = shared_sandbox(None, "cuda")
    assert box.proc is not None and box.proc.pid != os.getpid()
    started = time.perf_counter()
    for _ in range(10):
        problem.reference(x, w, eps)
    per_call_ms = (time.perf_counter() - started) * 100
    print(f"\nreference through the sandbox at 32768x4096 bf16: {per_call_ms:.2f} ms per call")
    assert per_call_ms < 500


def test_a_failing_gpu_reference_is_a_reference_error_and_the_next_call_works(tmp_path):
    requires_gpu()
    from kfc.check.sandbox import ReferenceFailed
    from kfc.factory.problem import op_problem
    from kfc.frontend import load_kfc, parse_kfc

    text = open("kernels/softmax.kfc").read().replace(
        'reference = "torch.softmax(x.float(), dim=-1).to(x.dtype)"', 'reference = "exit(0)"')
    bad = op_problem(parse_kfc(text, "bad_softmax.kfc"))
    (x,) = bad.make_inputs({"M": 7, "N": 4095}, 1, 1.0)
    with pytest.raises(ReferenceFailed, match="called exit"):
        bad.reference(x)
    good = op_problem(load_kfc("kernels/softmax.kfc"))
    [ref] = good.reference(x)
    assert torch.allclose(ref, torch.softmax(x.float(), -1).to(x.dtype).float())
