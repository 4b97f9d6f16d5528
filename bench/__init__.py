"""Benchmarks (not part of the installed distribution): run them from the repo root."""
