"""Benchmarks that compare in one run and report ratios: ``python -m bench``."""
