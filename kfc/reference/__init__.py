"""Plain torch reference implementations, used as correctness oracles for generated kernels."""
