"""Ops written over several parallel indices, as a framework author writes them: a norm per
(token, head) and a scaled add per (batch, token, head) (the CPU and GPU tests share them)."""

HEADNORM = """
op headnorm(q: f32[T, H, D], w: f32[D]) -> (y: f32[T, H, D]) {
  parallel t in 0..T, h in 0..H {
    qr = q[t, h, :]
    y[t, h, :] = qr * rsqrt(mean(qr * qr) + 1e-6) * w
  }
}
check {
  reference = "q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * w"
  shapes = [{T: 5, H: 3, D: 128}, {T: 1, H: 1, D: 7}]
}
"""

BTH = """
op bth<T: bf16 | f32>(x: T[B, S, H, D], s: f32[H]) -> (y: T[B, S, H, D]) {
  parallel b in 0..B, t in 0..S, h in 0..H {
    y[b, t, h, :] = T(f32(x[b, t, h, :]) * s[h])
  }
}
check {
  reference = "(x.float() * s[:, None]).to(x.dtype)"
  shapes = [{B: 2, S: 3, H: 4, D: 64}, {B: 1, S: 1, H: 1, D: 3}]
}
"""
