"""Probe which 16-bit float kernels onnxruntime's CPU provider has for each op llmir lowers, and
write the table the onnxruntime target reads (llmir_core/targets/onnxruntime/kernel_table.py).

For every registered op whose `example` computes in f32, the example is rebuilt in f16 and in
bf16, lowered op by op to ONNX (the generic lowering) and loaded in an onnxruntime CPU session:

- `native`: the session loads and onnxruntime runs the node(s) in that dtype;
- `cast`: the session loads only because onnxruntime inserted its own Cast nodes around the
  node(s) (its InsertCastTransformer does this for f16, never for bf16): the node runs in f32;
- missing: the session fails ("Could not find an implementation").

    python scripts/probe_ort_kernels.py            # rewrite llmir_core/targets/onnxruntime/kernel_table.py
    python scripts/probe_ort_kernels.py --check    # exit 1 when the file differs from a probe

The `ort.*` target ops and `llm.embedding` are measured separately (benchmarks/precision_kernels.py)
and listed by hand in ort_kernels.py's header part, which this script keeps.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "llmir_core", "targets", "onnxruntime", "kernel_table.py")
sys.path.insert(0, ROOT)

_ELEM = re.compile(r"(?<=[x<\s])(f16|i64)\b(?![^{]*})")  # element types outside attributes
_F32 = re.compile(r"(?<=[x<\s])f32\b")  # f32 as a tensor element type (or a cast's `to`)
MARK = "# -- probed (scripts/probe_ort_kernels.py) --"


def _probe_one(text: str) -> str | None:
    """'native', 'cast' or None (no kernel) for a one-op module text."""
    import onnxruntime as ort

    from llmir_core.ir.parser import parse_module
    from llmir_core.targets.onnxruntime.graph import to_onnx

    module = parse_module(text, "<probe>")
    model, _, _, _ = to_onnx(module, inline_weights=True)
    before = sum(1 for n in model.graph.node if n.op_type == "Cast")
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as d:
        so.optimized_model_filepath = os.path.join(d, "opt.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - a failed load is the answer
            return None
        import onnx

        opt = onnx.load(so.optimized_model_filepath)
    after = sum(1 for n in opt.graph.node if n.op_type == "Cast")
    return "cast" if after > before else "native"


def probe() -> dict[str, dict[str, str]]:
    from llmir_core.dialects.registry import all_ops
    from llmir_core.ir.snippet import module_text, op_function

    table: dict[str, dict[str, str]] = {}
    for name, od in sorted(all_ops().items()):
        if name.startswith("ort.") or "\n" in (od.example or "").strip():
            continue
        dialects = {"core", od.dialect}
        # the example as written, else with its element types made f32 (f16 / i64 examples)
        ex = ""
        for cand in (od.example or "", _ELEM.sub("f32", od.example or "")):
            if not _F32.search(cand):
                continue
            try:
                if _probe_one(module_text([op_function(cand, "main")], dialects=dialects)):
                    ex = cand
                    break
            except Exception:  # noqa: BLE001 - ops the generic lowering cannot build this way
                continue
        if not ex:
            continue
        row: dict[str, str] = {}
        for dt in ("f16", "bf16"):
            text = module_text([op_function(_F32.sub(dt, ex), "main")], dialects=dialects)
            try:
                got = _probe_one(text)
            except Exception as e:  # noqa: BLE001
                if os.environ.get("PROBE_DEBUG"):
                    print(name, dt, e, file=sys.stderr)
                got = None
            if got is not None:
                row[dt] = got
        table[name] = row
    return table


def render(table: dict[str, dict[str, str]]) -> str:
    import onnxruntime as ort

    lines = [
        MARK,
        f"# onnxruntime {ort.__version__}, CPUExecutionProvider",
        "PROBED: dict[str, dict[str, str]] = {",
    ]
    for name, row in table.items():
        inner = ", ".join(f'"{k}": "{v}"' for k, v in row.items())
        lines.append(f'    "{name}": {{{inner}}},')
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    with open(OUT, encoding="utf-8") as fh:
        old = fh.read()
    head = old.split(MARK)[0]
    new = head + render(probe())
    if a.check:
        if new != old:
            print(f"{OUT}: differs from a probe of the installed onnxruntime", file=sys.stderr)
            return 1
        return 0
    tmp = OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(new)
    os.replace(tmp, OUT)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
