"""A loss over a vocabulary as a framework author writes it: a row reduction plus one element
read at an index taken from memory (shared by the codegen test and the GPU one)."""

XENT = """
op xent<T: bf16 | f16 | f32>(x: T[M, N], label: i32[M]) -> (loss: f32[M]) {
  parallel m in 0..M {
    xr = f32(x[m, :])
    mx = max(xr)
    loss[m] = log(sum(exp(xr - mx))) + mx - f32(x[m, label[m]])
  }
}
"""
