"""The first index of each row's maximum, as a framework author writes it: a row reduction, then
`iota` of the row's dim compared against it (shared by the codegen test and the GPU one)."""

ARGMAX = """
op argmax<T: bf16 | f16 | f32>(x: T[M, N]) -> (index: i32[M]) {
  parallel m in 0..M {
    xr = f32(x[m, :])
    mx = max(xr)
    at = f32(iota(N))
    index[m] = i32(min(where(xr == mx, at, f32(N))))
  }
}
"""
