"""Floor 0: the plain data every layer of kfc shares (../shared/LAYERS.md) — the op spec and its
check block, the factory's records, the GPU targets and the version. It imports nothing of kfc
above kfc.diagnostics."""
