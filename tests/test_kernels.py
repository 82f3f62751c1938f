"""Every kernel in kernels/ parses, verifies, round-trips through IR text and passes `kfc check`."""

import re
from pathlib import Path

import pytest

from kfc.check.runner import check_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.frontend.spec import instances
from kfc.ir import parse_ir, print_ir, verify

KERNELS = sorted(Path("kernels").glob("*.kfc")) if Path("kernels").is_dir() else sorted(
    (Path(__file__).resolve().parent.parent / "kernels").glob("*.kfc"))
NAMES = [p.stem for p in KERNELS]


def test_the_library_has_the_five_kernels():
    assert {"rmsnorm", "layernorm", "softmax", "gemm", "kda_fwd"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_round_trips(name):
    spec = load_kfc(f"kernels/{name}.kfc")
    text = print_ir(spec.func)
    again = verify(parse_ir(text, f"{name}.kir"))
    assert print_ir(again) == text


@pytest.mark.parametrize("name", NAMES)
def test_kernel_passes_check(name):
    spec = load_kfc(f"kernels/{name}.kfc")
    results = check_op(spec)
    assert results, "no comparisons ran"
    bad = [r for r in results if not r.ok]
    assert not bad, bad[:3]
    # every output of every case was compared on the block's seeds plus a fresh one
    assert len({r.seed for r in results}) == len(spec.check.seeds) + 1


def test_kda_matches_the_recurrence_within_5e_3():
    spec = load_kfc("kernels/kda_fwd.kfc")
    shapes = [dict(s) for s in spec.check.shapes]
    # the acceptance cases: several sequences of uneven length, and a T that is not a multiple of 64
    assert any(s["N"] >= 2 for s in shapes)
    assert any(s["T"] % 64 for s in shapes)
    results = check_op(spec, seeds=[11, 12])
    assert {r.variant for r in results} == {"h0 given", "h0 absent"}
    for r in results:
        assert r.ok, r
        assert r.rel_rmse < 5e-3, r


def test_kda_keeps_its_accuracy_beside_reset_gates_of_minus_1e5():
    """The check block's gates hold resets of -1e5 (2% of the entries). The kernel floors each
    gate at -100 before the chunk's cumulative sum (exp of either is 0 in f32); without that
    floor a reset swamps the small gates beside it and the check fails."""
    spec = load_kfc("kernels/kda_fwd.kfc")
    g = spec.check.inputs["g"]
    assert (g.name, g.args) == ("logsigmoid_resets", (3, 1, 0.02, -1e5))
    text = next(p for p in KERNELS if p.stem == "kda_fwd").read_text()
    floor = "max(g[0, t:t+C limit eos, h, :], -100.0)"
    assert floor in text
    unfloored = parse_kfc(text.replace(floor, "g[0, t:t+C limit eos, h, :]"))
    shape = [{"N": 1, "T": 200, "H": 2, "K": 32, "V": 32}]
    # the kernel as written passes on these gates: test_kernel_passes_check[kda_fwd]
    assert not all(r.ok for r in check_op(unfloored, seeds=[0], shapes=shape))


def test_kda_in_flashkdas_interface_checks_what_it_computes_in_the_kernel():
    """kernels/kda_fwd_flashkda.kfc against kfc.reference.kda:kda_flashkda (FlashKDA's gate, q/k
    L2 norm, beta logits, V-first states): the check fails where the kernel skips the L2 norm or
    lets the rows past a sequence's end decay the state."""
    path = next(p for p in KERNELS if p.stem == "kda_fwd_flashkda")
    text = path.read_text()
    shape = [{"N": 2, "T": 37, "H": 1, "K": 8, "V": 8}]
    # the kernel as written passes: test_kernel_passes_check[kda_fwd_flashkda]
    for right, wrong in [("gl = where(valid[:, None], gate, 0.0)", "gl = gate"),
                         ("qr * rsqrt(sum(qr * qr, axis=1) + 1e-6)[:, None] * scale", "qr * scale")]:
        assert right in text
        assert not all(r.ok for r in check_op(parse_kfc(text.replace(right, wrong)), seeds=[0], shapes=shape)), wrong


@pytest.mark.parametrize("path", ["kernels/kda_fwd.kfc", "kernels/kda_fwd_flashkda.kfc", "kernels/kda_fwd_fla.kfc"])
def test_kda_takes_its_chunk_as_a_parameter(path):
    """`op kda_fwd<C: 64 | 32 | 16>`: the chunk a size the op is instantiated with (64 unless
    bound); each chunk computes what the recurrence does, its metric counts its own chunk."""
    spec = load_kfc(path)
    assert dict(spec.type_params)["C"] == ("64", "32", "16") and spec.dtypes["C"] == "64"
    # a size is a configuration: the instances kfc check runs vary the dtypes alone
    assert {inst.dtypes["C"] for inst in instances(spec)} == {"64"}
    shape = [{"N": 2, "T": 37, "H": 1, "HV": 2, "K": 8, "V": 8}]
    for c in ("16", "32"):
        inst = load_kfc(path, {"C": c})
        assert inst.dtypes["C"] == c and f"2 * {c} * (K + V)" in inst.metric.formula
        assert f"[{c}, {c}]" in print_ir(inst.func) and "[64, 64]" not in print_ir(inst.func)  # its masks
        assert all(r.ok for r in check_op(inst, seeds=[0], shapes=shape)), c


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the wrong sign overflows: the check reports it
def test_kda_in_flas_gated_interface_checks_what_it_computes_in_the_kernel():
    """kernels/kda_fwd_fla.kfc against kfc.reference.kda:kda_fla_gated (fla's softplus gate and
    q/k L2 norm in the kernel, grouped value heads): the check fails where the kernel skips the
    norm, takes the gate's sign the other way, pairs value heads with the wrong q/k heads or lets
    the rows past a sequence's end decay the state."""
    path = next(p for p in KERNELS if p.stem == "kda_fwd_fla")
    text = path.read_text()
    shape = [{"N": 2, "T": 37, "H": 2, "HV": 4, "K": 8, "V": 8}]
    # the kernel as written passes: test_kernel_passes_check[kda_fwd_fla]
    for right, wrong in [("gl = where(valid[:, None], max(gate, -100.0), 0.0)", "gl = gate"),
                         ("rate = -exp(A_log[h])", "rate = exp(A_log[h])"),
                         ("hq = h // (HV // H)", "hq = h % H"),  # value heads paired with q/k heads in turn, not in groups
                         ("qc = qr * qn[:, None] * scale", "qc = qr * scale")]:
        assert right in text
        assert not all(r.ok for r in check_op(parse_kfc(text.replace(right, wrong)), seeds=[0], shapes=shape)), wrong


def test_kda_in_flas_interface_takes_f16_inputs_bf16_states_and_int64_offsets():
    """The dtypes fla's chunk_kda takes, as type parameters: inputs bf16 or f16, states f32 or
    bf16 (held in f32 inside), cu_seqlens int32 or int64; each instance checked against the
    recurrence."""
    path = "kernels/kda_fwd_fla.kfc"
    shape = [{"N": 2, "T": 37, "H": 1, "HV": 2, "K": 8, "V": 8}]
    for bound in ({"X": "f16", "SD": "bf16", "IX": "i64", "C": "16"}, {"X": "bf16", "SD": "bf16", "IX": "i32"}):
        inst = load_kfc(path, bound)
        types = {a.name: str(a.ttype.dtype) for a in inst.func.args}
        assert (types["q"], types["h0"], types["cu_seqlens"]) == (bound["X"], bound["SD"], bound["IX"])
        assert all(r.ok for r in check_op(inst, seeds=[0], shapes=shape)), bound


def test_kfc_load_binds_a_size_parameter():
    """kfc.load(path, bind={"C": 32}): the kernel a framework calls takes that chunk; a size the
    op does not list is refused at the op's header."""
    import kfc
    from kfc.diagnostics import KfcError

    assert kfc.load("kernels/kda_fwd.kfc", bind={"C": 32}).spec.dtypes["C"] == "32"
    assert kfc.load("kernels/kda_fwd.kfc").spec.dtypes["C"] == "64"
    with pytest.raises(KfcError, match=re.escape("type parameter C takes 64 | 32 | 16, not 48")):
        kfc.load("kernels/kda_fwd.kfc", bind={"C": 48})
