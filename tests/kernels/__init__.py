"""Tests of llmir's compiled kernels (llmir_core/backends/ort_ext) by op."""
