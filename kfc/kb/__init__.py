"""The knowledge base: every tuning experiment with its provenance (SQLite or PostgreSQL: store,
database, schema, rows, postgres), op fingerprints and similarity (fingerprint, op_similarity),
and a graph of pass sequences with payoff statistics for policies to read (graph). Import from
the module: `kfc --help` imports kfc.kb.cli, which needs neither kfc.ir (fingerprint) nor
networkx (graph)."""
