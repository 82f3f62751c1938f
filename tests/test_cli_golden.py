"""Golden tests for hostile input to the CLI: each case runs `kfc ...` in-process and must end
with exactly the exit status and the stderr in `tests/golden/cli/NAME.expected` (`{tmp}` stands
for the test's temporary folder). One case for each kind of input that once miscompiled, hung,
ran unasked, crashed kfc, was wrongly accepted or got a poor message.

After a deliberate change to a message:

    KFC_UPDATE_GOLDEN=1 pytest tests/test_cli_golden.py

then read the diff: every message must say what, where and what to do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kfc.cli import main

REPO = Path(__file__).resolve().parent.parent
G = "tests/golden/cli"
UPDATE = os.environ.get("KFC_UPDATE_GOLDEN") == "1"

CASES = {
    # dims: a negative dim is an error at the type that uses it, in every command
    "negative_dim_compile": ["compile", f"{G}/negative_dim.kfc", "--shape", "N=8", "-o", "{tmp}/out"],
    "negative_dim_opt": ["opt", f"{G}/negative_dim.kfc", "--shape", "N=8"],
    # the reference: every way it fails is one error at its line
    "reference_exit": ["check", f"{G}/reference_exit.kfc"],
    "reference_endless": ["check", f"{G}/reference_endless.kfc", "--reference-timeout", "1"],
    "reference_segfault": ["check", f"{G}/reference_segfault.kfc"],
    "reference_none": ["check", f"{G}/reference_none.kfc"],
    "reference_raises": ["check", f"{G}/reference_raises.kfc"],
    "reference_wrong_shape": ["check", f"{G}/reference_wrong_shape.kfc"],
    # once internal errors
    "nested_calls_300": ["opt", f"{G}/nested_calls_300.kfc"],
    "uniform_reversed": ["check", f"{G}/uniform_reversed.kfc"],
    "check_seed_negative": ["check", f"{G}/scalar_named_e.kfc", "--seed", "-1"],
    "compile_output_is_a_file": ["compile", f"{G}/scalar_named_e.kfc", "-o", f"{G}/scalar_named_e.kfc"],
    "compile_output_under_a_file": ["compile", f"{G}/scalar_named_e.kfc", "-o", f"{G}/scalar_named_e.kfc/out"],
    "opt_output_is_the_input": ["opt", f"{G}/scalar_named_e.kfc", "-o", f"{G}/scalar_named_e.kfc"],
    "opt_symlink_loop": ["opt", "{tmp}/loop.kfc"],
    "opt_dev_zero": ["opt", "/dev/zero"],
    "opt_too_large": ["opt", "{tmp}/big.kfc"],
    # once wrongly accepted
    "tune_budget_negative": ["tune", f"{G}/scalar_named_e.kfc", "--budget", "-5"],
    "tune_budget_zero": ["tune", f"{G}/scalar_named_e.kfc", "--budget", "0"],
    "compile_target_empty": ["compile", f"{G}/scalar_named_e.kfc", "--target", ""],
    "opt_shape_twice": ["opt", f"{G}/scalar_named_e.kfc", "--shape", "N=4,N=5"],
    "opt_dtype_twice": ["opt", "kernels/softmax.kfc", "--dtype", "T=f16,T=f32"],
    "opt_shape_flag_twice": ["opt", f"{G}/scalar_named_e.kfc", "--shape", "N=4", "--shape", "N=5"],
    "compile_vec_3": ["compile", f"{G}/scalar_named_e.kfc", "-p", "tile{vec=3}", "-o", "{tmp}/out"],
    "opt_max_iterations_negative": ["opt", f"{G}/scalar_named_e.kfc", "-p", "canonicalize{max_iterations=-1}"],
    "opt_print_ir_before_bogus": ["opt", f"{G}/scalar_named_e.kfc", "-p", "canonicalize", "--print-ir-before", "bogus"],
    "opt_print_ir_before_without_pipeline": ["opt", f"{G}/scalar_named_e.kfc", "--print-ir-before", "tile"],
    # once poor messages
    "opt_shape_zero": ["opt", f"{G}/scalar_named_e.kfc", "--shape", "N=0"],
    "opt_bad_pass_option_value": ["opt", f"{G}/scalar_named_e.kfc", "-p", "lower-ptx{approx=x}"],
    "compile_pipeline_leaves_loads": ["compile", f"{G}/scalar_named_e.kfc", "-p", "tile", "-o", "{tmp}/out"],
    "opt_not_utf8": ["opt", f"{G}/not_utf8.kfc"],
    "check_ir_text": ["check", "{tmp}/op.kir"],
    # valid ops that once failed: exit 0 and nothing on stderr
    "flat_sum_400_check": ["check", f"{G}/flat_sum_400.kfc"],
    "flat_sum_400_compile": ["compile", f"{G}/flat_sum_400.kfc", "-o", "{tmp}/out"],
    "scalar_named_e_check": ["check", f"{G}/scalar_named_e.kfc"],
    # not a row program (a reduction keeps its axis): the tile emitter compiles it
    "compile_keepdims_row": ["compile", f"{G}/keepdims_row.kfc", "-o", "{tmp}/out"],
}


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "loop.kfc").symlink_to(tmp_path / "loop2.kfc")
    (tmp_path / "loop2.kfc").symlink_to(tmp_path / "loop.kfc")
    (tmp_path / "big.kfc").write_text("#" * (2 << 20))
    assert main(["opt", f"{G}/scalar_named_e.kfc", "-o", str(tmp_path / "op.kir")]) == 0
    return tmp_path


def run_case(name: str, tmp: Path, capsys) -> str:
    argv = [a.replace("{tmp}", str(tmp)) for a in CASES[name]]
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    err = err.replace(str(tmp), "{tmp}")
    return f"exit {code}\n{err}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_golden(name, inputs, capsys):
    got = run_case(name, inputs, capsys)
    path = REPO / G / f"{name}.expected"
    if UPDATE:
        path.write_text(got)
    assert path.exists(), f"{path} is missing; run with KFC_UPDATE_GOLDEN=1 and review it"
    assert got == path.read_text()
    assert "Traceback" not in got
    code = int(got.split("\n", 1)[0].split()[1])
    if code == 0:
        assert got == "exit 0\n", "a valid op prints nothing on stderr"
    else:
        assert code == 2, "bad input is exit status 2"
        assert got.count("error:") == 1, "one message"
        assert "\nhint: " in got, "and a hint"


def test_every_expected_file_has_a_case():
    stems = {p.stem for p in (REPO / G).glob("*.expected")}
    assert stems == set(CASES)


def test_the_scalar_named_e_compiles_to_a_kernel_that_multiplies_by_it(inputs):
    out = inputs / "sc"
    assert main(["compile", f"{G}/scalar_named_e.kfc", "-o", str(out)]) == 0
    cu = (out / "sc.cu").read_text()
    body = cu.split("kfc_kernel_sc(", 1)[1]
    assert "float p_e" in body.split(")", 1)[0]
    assert re.search(r"\] = p_e;", body), "the broadcast reads the scalar, not a loop counter"


def test_a_toolchain_failure_shows_the_first_errors_in_the_kept_source(inputs, capsys, monkeypatch):
    """nvcc rejecting generated code is kfc's bug: exit 3, the first error with its place in the
    kept .cu, that file's path, and no hint naming a flag that does not exist."""
    from kfc import compile as compile_module

    real = compile_module.generate_cuda

    def broken(func):
        code, plan = real(func)
        assert "unsigned kfc_phase = 0;" in code
        return code.replace("unsigned kfc_phase = 0;", "unsigned kfc_phase = 0; int kfc_planted = undeclared_name;", 1), plan

    monkeypatch.setattr(compile_module, "generate_cuda", broken)
    assert main(["compile", f"{G}/scalar_named_e.kfc", "-o", str(inputs / "out")]) == 3
    err = capsys.readouterr().err
    m = re.search(r"kept in (\S+)\):", err)
    assert m, err
    kept = Path(m.group(1))
    assert (kept / "kernel.cu").exists()
    lines = err.splitlines()
    assert lines[0].startswith("kfc: internal error: nvcc (CUDA C++ to PTX) rejected the generated kernel")
    assert lines[1].startswith(f"{kept / 'kernel.cu'}(") and 'identifier "undeclared_name" is undefined' in lines[1]
    line_no = int(re.search(r"kernel\.cu\((\d+)\)", lines[1]).group(1))
    assert "undeclared_name" in (kept / "kernel.cu").read_text().splitlines()[line_no - 1]
    assert "--keep" not in err and "hint: this is a bug in kfc" in err


def test_the_deepest_nesting_kfc_reads_also_reads_back_as_ir_and_checks(tmp_path, capsys):
    """Loops nested as deep as the front end allows: kfc opt writes IR that kfc opt reads back,
    and kfc check runs it; one level deeper is the clear nesting error, never a RecursionError."""
    def nest(n: int) -> Path:
        body = "y[m, :] = x[m, :]"
        for i in range(n):
            body = f"for t{i} in 0..1 {{ {body} }}"
        f = tmp_path / f"loops{n}.kfc"
        f.write_text(f"op deep(x: f32[M, N]) -> (y: f32[M, N]) {{ parallel m in 0..M {{ {body} }} }}\n"
                     'check { reference = "x" shapes = [{M: 2, N: 3}] }\n')
        return f

    n = 80
    while main(["opt", str(nest(n + 1)), "-o", str(tmp_path / "ir.kir")]) == 0:
        n += 1
    err = capsys.readouterr().err
    assert "nests more than 200 levels deep" in err and "Traceback" not in err
    deepest = nest(n)
    assert main(["opt", str(deepest), "-o", str(tmp_path / "deep.kir")]) == 0
    assert main(["opt", str(tmp_path / "deep.kir")]) == 0
    assert main(["check", str(deepest)]) == 0
