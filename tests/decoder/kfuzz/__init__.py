"""Hostile one-node cases of llmir's kernels, per op family (run by tests/decoder/kernel_cases.py)."""
