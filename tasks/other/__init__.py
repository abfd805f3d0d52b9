"""Distributed algorithms that are not one parallelism scheme: sorting with data-dependent splits,
sharded selection."""
