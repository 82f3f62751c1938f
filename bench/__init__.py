"""Benchmarks: kfc against its peers, and kfc's own compile-time costs."""
