"""Tests of llmir_core.quant."""
