"""Benchmarks: each prints a table and writes JSON. Timings live here, never in unit tests."""
