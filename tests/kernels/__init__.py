"""Tests of llmir's compiled kernels (llmir_core/targets/onnxruntime/native) by op."""
