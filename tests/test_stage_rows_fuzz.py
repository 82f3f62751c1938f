"""stage-rows on random row programs: any mix of row inputs (bf16, f32), a shared weight,
elementwise math and reductions, staged at every length, keeps its results through the whole
row pipeline (--verify-each runs the interpreter before and after every pass), the barrier
check holds after every pass, and the code generator takes what comes out."""

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from kfc.codegen.cuda import generate_cuda
from kfc.ir import ALL, Builder, DType, SymDim, tensor, verify
from kfc.ir.smem_ops import SmemAllocOp
from kfc.passes import ROW_PIPELINE, PassContext, PassManager, VerifyEach, parse_pipeline
from kfc.model.target import parse_target

STAGED_PIPELINE = ROW_PIPELINE.replace("stage-rows", "stage-rows{min_bytes=0,heavy=stage}")
UNARY = ["neg", "abs", "tanh", "sigmoid"]
BINARY = ["add", "sub", "mul", "max", "min"]
REDUCE = ["sum", "max", "min", "mean"]


@st.composite
def row_programs(draw):
    n = draw(st.sampled_from([8, 64, 264, 1024]))      # 16-byte rows in bf16 and f32: all stageable
    dtypes = draw(st.lists(st.sampled_from([DType.BF16, DType.F32]), min_size=1, max_size=3))
    m = SymDim("M")
    b = Builder()
    inputs = [(f"x{i}", tensor(d, m, n)) for i, d in enumerate(dtypes)] + [("w", tensor(DType.F32, n))]
    outputs = [("y", tensor(DType.F32, m, n)), ("s", tensor(DType.F32, m))]
    with b.func("f", inputs=inputs, outputs=outputs) as f:
        *xs, w, y, s = f.args
        with b.parallel([(0, b.dim("M"))]) as (row,):
            rows = [b.cast(b.load(x, [row, ALL]), DType.F32) if x.ttype.dtype is not DType.F32
                    else b.load(x, [row, ALL]) for x in xs]
            rows.append(b.load(w, [ALL]))
            scalars = [b.const(0.5, DType.F32)]
            for _ in range(draw(st.integers(1, 7))):
                kind = draw(st.sampled_from(["unary", "binary", "scalar", "reduce"]))
                a = draw(st.sampled_from(rows))
                if kind == "unary":
                    rows.append(b.unary(draw(st.sampled_from(UNARY)), a))
                elif kind == "binary":
                    rows.append(b.binary(draw(st.sampled_from(BINARY)), a, draw(st.sampled_from(rows))))
                elif kind == "scalar":  # a row against a reduction's result: values cross a stretch
                    rows.append(b.binary(draw(st.sampled_from(["mul", "add", "sub"])), a,
                                         draw(st.sampled_from(scalars))))
                else:
                    scalars.append(b.reduce(draw(st.sampled_from(REDUCE)), a))
            b.store(b.binary("add", rows[-1], rows[0]), y, [row, ALL])  # x0's row always reaches y
            b.store(scalars[-1], s, [row])
    return verify(f.op)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(func=row_programs())
def test_staging_random_row_programs_keeps_their_results(func):
    ctx = PassContext(parse_target("sm_90a"), verify_each=VerifyEach({"M": 3}, None, seeds=(0,)))
    lowered = PassManager(parse_pipeline(STAGED_PIPELINE), ctx).run(func)
    assert any(isinstance(op, SmemAllocOp) for op in lowered.walk()), "x0's row is stageable and used"
    code, plan = generate_cuda(lowered)
    assert "cp.async.bulk" in code and plan.smem_dynamic > 0
