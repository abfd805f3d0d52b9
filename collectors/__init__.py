"""Telemetry: NVML/GPM and host samplers, the SQLite sample sink, per-phase counters, kernel profiler.

Usable with no UI at all. Nothing here imports Textual.
"""
