"""The `llm` dialect (filled by the llm-ops work)."""

from .registry import register_dialect

register_dialect("llm", "language-model ops: embedding, norms, rotary, attention, KV cache, quantization")
