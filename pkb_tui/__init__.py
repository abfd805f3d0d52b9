"""pkb-tui: evaluate multi-GPU communication kernels (engine, store, CLI and dashboard)."""

__version__ = "0.1.0"
