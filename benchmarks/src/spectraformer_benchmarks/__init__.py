"""Benchmarks of the spectraformer packages, each module run as ``python -m spectraformer_benchmarks.<name>``.

Shared pieces: `common` (pair lists, the machine's description, the measuring subprocesses and their
environment), `counting` (aten operations and matmul FLOPs of a step). Timing and peak memory are
``app_common.measure``'s.
"""
