"""GPTQ, AWQ and compressed-tensors checkpoints: folders written here in each format's layout
from a tiny random llama (transformers), quantized by llmir's packer.

Checked: the imported weights stay packed (`core.weight` of the checkpoint's own bytes); their
dequantization is bit-identical to the format's reference formula (re-implemented below with
numpy index arithmetic per field, independently of llmir_core.quant); the imported model's greedy
tokens (32) and logits equal transformers running the dequantized f32 weights; the onnxruntime
build repacks them losslessly to MatMulNBits where the format allows (same logits as the
interpreter) and reports the error where it requantizes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf
from llmir_core.interp import Interpreter
from llmir_core.ir.types import DType, QuantType
from llmir_core.quant import int32_packed

from .tiny import check_against_full_forward, ir_greedy

LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
PROMPT = np.random.default_rng(3).integers(3, 120, (1, 7))

# -- the reference dequantization formulas, written from the formats' specs --------------------------


def _field(words: np.ndarray, j: np.ndarray | int, bits: int) -> np.ndarray:
    """Field j (bits wide, counted from the least significant end) of each int32 word."""
    u = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    return (u >> (np.asarray(j) * bits)) & ((1 << bits) - 1)


def ref_gptq(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray,
    bits: int,
    v1: bool,
) -> np.ndarray:
    """W[n, k] = scales[g, n] * (q - z), g = g_idx[k]; q is field k % pf of qweight[k // pf, n],
    z field n % pf of qzeros[g, n // pf], plus one in the v1 format."""
    pf = 32 // bits
    k_dim, n_dim = qweight.shape[0] * pf, scales.shape[1]
    k, n = np.arange(k_dim)[:, None], np.arange(n_dim)[None, :]
    g = g_idx.astype(np.int64)[:, None]
    q = _field(qweight[k // pf, n], k % pf, bits)
    z = _field(qzeros[g, n // pf], n % pf, bits) + (1 if v1 else 0)
    return ((q - z).astype(np.float32) * scales[g, n].astype(np.float32)).T


def ref_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """AWQ GEMM: word c of row k holds output columns c*8 + [0, 2, 4, 6, 1, 3, 5, 7] in fields 0..7."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    k_dim, n_dim = qweight.shape[0], scales.shape[1]
    out = np.zeros((n_dim, k_dim), np.float32)
    g = np.arange(k_dim) // group
    for c in range(n_dim // 8):
        for i in range(8):
            n = c * 8 + order[i]
            q, z = _field(qweight[:, c], i, 4), _field(qzeros[g, c], i, 4)
            out[n] = (q - z).astype(np.float32) * scales[g, n].astype(np.float32)
    return out


def ref_ct(
    packed: np.ndarray,
    scale: np.ndarray,
    zero: np.ndarray | None,
    bits: int,
    n_dim: int,
    k_dim: int,
    group: int,
) -> np.ndarray:
    """compressed-tensors: signed q = field - 2**(bits-1) of weight_packed[n, k // pf]; signed zero
    of weight_zero_point[n // pf, g] (packed along dim 0); W = (q - zp) * scale[n, g]."""
    pf, off = 32 // bits, 1 << (bits - 1)
    n, k = np.arange(n_dim)[:, None], np.arange(k_dim)[None, :]
    g = k // group
    q = _field(packed[n, k // pf], k % pf, bits) - off
    zp = 0 if zero is None else _field(zero[n // pf, g], n % pf, bits) - off
    return (q - zp).astype(np.float32) * scale[n, g].astype(np.float32)


# -- writing checkpoints ------------------------------------------------------------------------------


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(folder / "model.safetensors")))


def write_checkpoint(
    src: Path,
    out: Path,
    fmt: str,
    bits: int = 4,
    group: int = 32,
    sym: bool = True,
    act_order: bool = False,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Quantize src's linear layers into `fmt`; return (dequantized f32 weights by module as the
    reference formula gives them, the stored arrays by tensor name)."""
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    tensors = _tensors(src)
    stored: dict[str, Any] = {}
    deq: dict[str, np.ndarray] = {}
    for name, t in list(tensors.items()):
        module = name.removesuffix(".weight")
        if not any(module.endswith(x) for x in LINEARS):
            continue
        w = t.float().numpy()
        n, k = w.shape
        block = k if group == -1 else group
        del tensors[name]
        if fmt in ("gptq", "gptq_v2", "awq", "ct-pack"):
            scheme = "ctpack" if fmt == "ct-pack" else fmt
            gi = None
            if act_order:
                perm = rng.permutation(k)
                gi = np.empty(k, np.int64)
                gi[perm] = np.arange(k) // block
            q, s, z = int32_packed.quantize_groups(
                w, bits, block, sym, np.dtype(np.float16), gi, min_zero=1 if fmt == "gptq" else 0
            )
            if scheme == "ctpack":
                p, sc, zp = int32_packed.pack(scheme, q, s, None if sym else z, bits)
                stored.update(
                    {
                        f"{module}.weight_packed": p,
                        f"{module}.weight_scale": sc,
                        f"{module}.weight_shape": np.array([n, k], np.int32),
                    }
                )
                if zp is not None:
                    stored[f"{module}.weight_zero_point"] = zp
                deq[module] = ref_ct(p, sc, zp, bits, n, k, block)
            else:
                p, sc, zp = int32_packed.pack(scheme, q, s, z, bits)
                assert zp is not None
                stored.update(
                    {f"{module}.qweight": p, f"{module}.qzeros": zp, f"{module}.scales": sc}
                )
                if scheme == "awq":
                    deq[module] = ref_awq(p, zp, sc, block)
                else:
                    g_idx = (np.arange(k) // block if gi is None else gi).astype(np.int32)
                    stored[f"{module}.g_idx"] = g_idx
                    deq[module] = ref_gptq(p, zp, sc, g_idx, bits, scheme == "gptq")
        elif fmt == "ct-fp8":
            amax = (
                np.abs(w).max(axis=1, keepdims=True) if group == -1 else np.abs(w).max().reshape(1)
            )
            scale = (amax / np.float32(448.0)).astype(np.float32)
            f8 = torch.from_numpy(w / scale).to(torch.float8_e4m3fn)
            stored[f"{module}.weight"] = f8
            stored[f"{module}.weight_scale"] = scale
            deq[module] = f8.float().numpy() * scale
        elif fmt == "ct-int8":
            scale = (np.abs(w).max(axis=1, keepdims=True) / 127).astype(np.float16)
            q8 = np.clip(np.round(w / scale.astype(np.float32)), -128, 127).astype(np.int8)
            stored[f"{module}.weight"] = q8
            stored[f"{module}.weight_scale"] = scale
            deq[module] = q8.astype(np.float32) * scale.astype(np.float32)
        else:
            raise ValueError(fmt)
    out.mkdir(parents=True)
    all_t = {
        **tensors,
        **{
            k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
            for k, v in stored.items()
        },
    }
    save_file(all_t, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = _quant_config(fmt, bits, group, sym, act_order)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = src / "generation_config.json"
    if gen.is_file():
        shutil.copy(gen, out / gen.name)
    return deq, {
        k: (
            v.float().numpy()
            if isinstance(v, torch.Tensor) and v.dtype == torch.float8_e4m3fn
            else np.asarray(v)
        )
        for k, v in stored.items()
    }


def _quant_config(fmt: str, bits: int, group: int, sym: bool, act_order: bool) -> dict[str, Any]:
    if fmt in ("gptq", "gptq_v2"):
        return {
            "quant_method": "gptq",
            "bits": bits,
            "group_size": group,
            "desc_act": act_order,
            "sym": sym,
            "damp_percent": 0.01,
            "true_sequential": True,
            "checkpoint_format": fmt,
        }
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": bits,
            "group_size": group,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    if fmt == "ct-pack":
        weights = {
            "num_bits": bits,
            "type": "int",
            "symmetric": sym,
            "dynamic": False,
            "strategy": "channel" if group == -1 else "group",
            "group_size": None if group == -1 else group,
            "actorder": None,
        }
        return {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "ignore": ["lm_head"],
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": weights,
                    "input_activations": None,
                    "output_activations": None,
                }
            },
        }
    if fmt == "ct-fp8":
        weights = {
            "num_bits": 8,
            "type": "float",
            "symmetric": True,
            "dynamic": False,
            "strategy": "channel" if group == -1 else "tensor",
        }
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "ignore": ["lm_head"],
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        }
    weights = {
        "num_bits": 8,
        "type": "int",
        "symmetric": True,
        "dynamic": False,
        "strategy": "channel",
    }
    acts = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}
        },
    }


def _dequantized_model(model: Any, deq: dict[str, np.ndarray]) -> Any:
    import copy

    import torch

    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in m.named_parameters():
            mod = name.removesuffix(".weight")
            if mod in deq:
                p.copy_(torch.from_numpy(deq[mod]))
    return m


def _weights_of(module: Any) -> dict[str, np.ndarray]:
    """The f32 value of every llm.dequantize / scaled weight in main, by HF module name."""
    interp = Interpreter(module)
    fn = module.main
    vals: dict[int, Any] = {}
    out: dict[str, np.ndarray] = {}
    for op in fn.ops:
        if all(id(v) in vals for v in op.operands) and (
            op.name in ("core.weight", "core.constant") or op.operands
        ):
            res = interp.eval_op(op, [vals[id(v)] for v in op.operands], {})
            for r, x in zip(op.results, res):
                vals[id(r)] = x
            if op.name in ("llm.dequantize", "core.mul"):
                src = op.operands[0].owner
                while src is not None and src.name != "core.weight":
                    src = src.operands[0].owner if src.operands else None
                if src is not None:
                    name = str(src.attrs["name"])
                    for suf in (".qweight", ".weight_packed", ".weight"):
                        name = name.removesuffix(suf)
                    out[name] = np.asarray(res[0])
    return out


CASES: dict[str, dict[str, Any]] = {
    "gptq-sym4": dict(fmt="gptq", bits=4, group=32, sym=True),
    "gptq-asym4": dict(fmt="gptq", bits=4, group=32, sym=False),
    "gptq-actorder": dict(fmt="gptq", bits=4, group=32, sym=False, act_order=True),
    "gptq-sym8": dict(fmt="gptq", bits=8, group=32, sym=True),
    "gptq-2bit": dict(fmt="gptq", bits=2, group=32, sym=False),
    "gptq_v2-channel": dict(fmt="gptq_v2", bits=4, group=-1, sym=False),
    "awq": dict(fmt="awq", bits=4, group=32, sym=False),
    "ct-w4a16": dict(fmt="ct-pack", bits=4, group=32, sym=True),
    "ct-w4-asym-channel": dict(fmt="ct-pack", bits=4, group=-1, sym=False),
    "ct-w8a16": dict(fmt="ct-pack", bits=8, group=-1, sym=True),
    "ct-fp8-tensor": dict(fmt="ct-fp8", group=0),
    "ct-fp8-channel": dict(fmt="ct-fp8", group=-1),
    "ct-w8a8": dict(fmt="ct-int8"),
}


@pytest.fixture(scope="module")
def checkpoints(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder, model = tiny_model("llama")
    root = tmp_path_factory.mktemp("quant")
    out: dict[str, Any] = {}
    for name, opts in CASES.items():
        deq, stored = write_checkpoint(folder, root / name, **opts)
        out[name] = (root / name, deq, stored, model)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_keeps_packing_and_dequantizes_exactly(
    case: str, checkpoints: dict[str, Any]
) -> None:
    folder, deq, stored, _ = checkpoints[case]
    module = import_hf(folder, require_tokenizer=False)
    assert module.attrs["llm.quantization"]["method"] in ("gptq", "awq", "compressed-tensors")
    fn = module.main
    weights = [op for op in fn.ops if op.name == "core.weight"]
    if CASES[case]["fmt"] not in ("ct-fp8", "ct-int8"):
        packed = [op for op in weights if "quant<" in str(op.results[0].type)]
        assert len(packed) == 2 * len(LINEARS)
        # the packed weight references the checkpoint's bytes unchanged
        op = packed[0]
        raw = np.fromfile(
            folder / "model.safetensors",
            np.uint8,
            int(op.attrs["nbytes"]),
            offset=int(op.attrs["offset"]),
        )
        assert raw.tobytes() == np.ascontiguousarray(stored[str(op.attrs["name"])]).tobytes()
    got = _weights_of(module)
    assert set(got) == set(deq)
    for mod, want in deq.items():
        np.testing.assert_array_equal(got[mod], want, err_msg=mod)


@pytest.mark.parametrize(
    "case", ["gptq-asym4", "gptq-actorder", "awq", "ct-w4a16", "ct-fp8-channel", "ct-w8a8"]
)
def test_greedy_parity_with_the_dequantized_model(case: str, checkpoints: dict[str, Any]) -> None:
    folder, deq, _, model = checkpoints[case]
    module = import_hf(folder, require_tokenizer=False)
    logits, tokens = ir_greedy(module, PROMPT, 32)
    diffs = check_against_full_forward(_dequantized_model(model, deq), PROMPT, logits, tokens)
    assert max(diffs) <= 1e-4


# transformers (with the `compressed-tensors` package) loads these folders on the CPU and
# decompresses them to float weights. Not here: GPTQ and AWQ folders (transformers needs optimum
# and gptqmodel, which build CUDA extensions); W8A8 (ct-w8a8: transformers quantizes activations
# per token at run time, llmir keeps them float); asymmetric pack-quantized (ct-w4-asym-channel:
# transformers 5.24 allocates weight_zero_point unpacked, [N, G], and re-initializes the packed
# [N / 8, G] tensor of the format as a size mismatch).
HF_LOADABLE = ("ct-w4a16", "ct-w8a16", "ct-fp8-tensor", "ct-fp8-channel")


@pytest.mark.parametrize("case", HF_LOADABLE)
def test_greedy_parity_with_transformers_loading_the_folder(
    case: str, checkpoints: dict[str, Any]
) -> None:
    pytest.importorskip("compressed_tensors", reason="pip install compressed-tensors (test extra)")
    import torch
    from transformers import AutoModelForCausalLM

    folder, _, _, _ = checkpoints[case]
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    module = import_hf(folder, require_tokenizer=False)
    logits, tokens = ir_greedy(module, PROMPT, 32)
    diffs = check_against_full_forward(hf, PROMPT, logits, tokens)
    assert max(diffs) <= 1e-4


@pytest.mark.parametrize(
    "case, lossless",
    [
        ("gptq-sym4", {"gptq": 14}),
        ("gptq-asym4", {"gptq": 14}),
        ("gptq-sym8", {"gptq": 14}),
        ("awq", {"awq": 14}),
        ("ct-w4a16", {"ctpack": 14}),
        ("ct-w4-asym-channel", {"ctpack": 12}),
        ("gptq-actorder", {}),
        ("gptq-2bit", {}),
        ("ct-fp8-tensor", {}),
    ],
)
def test_onnxruntime_build(
    case: str, lossless: dict[str, int], checkpoints: dict[str, Any], tmp_path: Path
) -> None:
    """Lossless repacks give the interpreter's logits (fp32 activations); act-order and
    down_proj's per-channel group of 96 are requantized with their error in the manifest."""
    pytest.importorskip("onnxruntime")
    from llmir_core.targets.onnxruntime.runner import open_decoder
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder
    from tests.decoder.helpers import greedy, parity, ref_decoder

    folder, _, _, _ = checkpoints[case]
    module = import_hf(folder, require_tokenizer=False)
    man = build_decoder(module, str(tmp_path / "a"), accuracy_level=1)
    q = man["decoder"]["quant"]
    assert q["gguf_lossless"] == lossless
    requant = q["gguf_requantized"]
    dec = open_decoder(str(tmp_path / "a"))
    if case in ("gptq-actorder", "gptq-2bit"):
        why = "act-order" if case == "gptq-actorder" else "4 or 8 bits, not 2"
        assert len(requant) == 14 and all(why in r["reason"] for r in requant)
        assert all(0 <= r["max_rel_error"] < 0.2 for r in requant)
        if case == "gptq-actorder":
            assert min(r["max_rel_error"] for r in requant) > 0
        assert parity(module, dec, PROMPT, steps=2) < 0.2
        return
    if case == "ct-w4-asym-channel":  # down_proj: one group of 96 columns
        assert len(requant) == 2 and all("group size 96" in r["reason"] for r in requant)
        assert parity(module, dec, PROMPT, steps=2) < 0.2
        return
    assert not requant
    assert parity(module, dec, PROMPT, steps=8) <= 1e-4
    prompt = [int(x) for x in PROMPT[0]]
    assert greedy(dec, prompt, 32) == greedy(ref_decoder(module), prompt, 32)


@pytest.mark.parametrize(
    "case, decision",
    [
        ("gptq-asym4", r"gptq repacked losslessly to int4 block 32"),
        ("gptq-actorder", r"gptq requantized to int4 block \d+ with zero points \(act-order g_idx"),
        (
            "gptq-2bit",
            r"requantized to int4 block \d+ with zero points \(MatMulNBits on CPU takes 4 or 8 bits, not 2\)",
        ),
    ],
)
def test_lowering_reports_the_packed_weight_decision(
    case: str, decision: str, checkpoints: dict[str, Any]
) -> None:
    """lower-ort-matmul decides lossless repack vs requantize and reports it (with the error)."""
    import re

    from llmir_core.passes.manager import run_pipeline
    from llmir_core.targets import get_target

    folder, _, _, _ = checkpoints[case]
    module = import_hf(folder, require_tokenizer=False)
    res = run_pipeline(module, get_target("onnxruntime").lowering({}))
    nbits_ops = [op for op in res.module.main.ops if op.name == "ort.matmul_nbits"]
    # one report per op: a plain matmul, or gate and up as one op with the SwiGLU epilogue
    details = [r.detail for r in res.ctx.rewrites if r.rule in ("matmul-nbits", "matmul-swiglu")]
    assert nbits_ops and len(details) == len(nbits_ops)
    assert any(re.search(decision, d) for d in details), details
    lossless = "losslessly" in decision
    packs = [op.operands[1].owner for op in nbits_ops]  # the rounding is the ort.pack's
    assert all(p is not None and p.name == "ort.pack" for p in packs)
    assert all(p.attrs["quantize"] == ("none" if lossless else "asym") for p in packs)
    if not lossless:
        errors = [float(e) for d in details for e in re.findall(r"max abs error ([0-9.e+-]+)", d)]
        assert errors and all(e >= 0 for e in errors)


def test_module_text_round_trips(checkpoints: dict[str, Any], tmp_path: Path) -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.ir.printer import print_module
    from llmir_core.verifier import verify

    folder = checkpoints["gptq-actorder"][0]
    module = import_hf(folder, out_path=tmp_path / "m.llmir", require_tokenizer=False)
    text = print_module(module)
    assert "!quant<gptq, bits=4, block=32, scale=f16, zero=int>" in text
    again = parse_module(text)
    verify(again)
    assert print_module(again) == text


def _edit(folder: Path, tmp: Path, **changes: Any) -> Path:
    out = tmp / "edited"
    shutil.copytree(folder, out)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    for k, v in changes.items():
        if v is None:
            qc.pop(k, None)
        else:
            qc[k] = v
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize(
    "case, changes, message",
    [
        (
            "gptq-sym4",
            {"quant_method": "bitsandbytes"},
            r"config\.json: field 'quantization_config\.quant_method' is 'bitsandbytes', which is not supported",
        ),
        ("gptq-sym4", {"bits": 3}, r"field 'quantization_config\.bits' is 3: supported 2, 4, 8"),
        (
            "gptq-sym4",
            {"checkpoint_format": "marlin"},
            r"field 'quantization_config\.checkpoint_format' is 'marlin'",
        ),
        (
            "gptq-sym4",
            {"group_size": 16},
            r"tensor 'model\.layers\.0\.self_attn\.q_proj\.scales' has shape \[2, 64\], expected \[4, 64\]",
        ),
        (
            "awq",
            {"version": "gemv"},
            r"field 'quantization_config\.version' is 'gemv': only the GEMM packing",
        ),
        (
            "ct-w4a16",
            {"format": "marlin-24"},
            r"field 'quantization_config\.format' is 'marlin-24', which is not supported",
        ),
        ("ct-w4a16", {"sparsity_config": {"format": "sparse-24"}}, r"sparsity_config' is set"),
        (
            "gptq-sym4",
            {"group_size": 0},
            r"cannot hold a \[64, 64\] weight in gptq layout: group size 0 is not positive",
        ),
        ("awq", {"bits": 8}, r"field 'quantization_config\.bits' is 8: supported 4"),
        ("awq", {"zero_point": False}, r"field 'quantization_config\.zero_point' is false"),
    ],
)
def test_config_errors(
    case: str, changes: dict[str, Any], message: str, checkpoints: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(InputError, match=message):
        import_hf(_edit(checkpoints[case][0], tmp_path, **changes), require_tokenizer=False)


def test_missing_g_idx_with_act_order(checkpoints: dict[str, Any], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    out = tmp_path / "m"
    shutil.copytree(checkpoints["gptq-actorder"][0], out)
    t = load_file(str(out / "model.safetensors"))
    del t["model.layers.0.self_attn.q_proj.g_idx"]
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(
        InputError,
        match=r"tensor 'model\.layers\.0\.self_attn\.q_proj\.g_idx' is missing, "
        r"but quantization_config asks for act-order",
    ):
        import_hf(out, require_tokenizer=False)


def test_packers_round_trip() -> None:
    rng = np.random.default_rng(0)
    for bits in (2, 4, 8):
        codes = rng.integers(0, 1 << bits, (16, 32)).astype(np.uint8)
        for axis in (0, 1):
            assert np.array_equal(
                int32_packed.unpack_int32(int32_packed.pack_int32(codes, bits, axis), bits, axis),
                codes,
            )
    with pytest.raises(ValueError, match="GPTQ v1 cannot store a zero point of 0"):
        int32_packed.pack(
            "gptq",
            np.zeros((8, 8), np.uint8),
            np.ones((8, 1), np.float16),
            np.zeros((8, 1), np.int64),
            4,
        )


def test_docs_table_is_generated_from_the_code() -> None:
    from llmir_core.frontends.hf_quant import format_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "llm-import.md").read_text(
        encoding="utf-8"
    )
    assert format_table() in doc, (
        "docs/llm-import.md: paste hf_quant.format_table() into the quant section"
    )


def test_phi3_and_compressed_tensors_scheme_errors(
    checkpoints: dict[str, Any], tmp_path: Path
) -> None:
    folder = checkpoints["ct-fp8-tensor"][0]
    cfg = json.loads((folder / "config.json").read_text())
    qc = cfg["quantization_config"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model_type": "phi3"}, r"field 'quantization_config' is set on a phi3 model"),
        (
            {
                "quantization_config": {
                    **qc,
                    "config_groups": {
                        "g": {
                            "targets": ["Linear"],
                            "weights": {"num_bits": 8, "type": "float", "strategy": "group"},
                        }
                    },
                }
            },
            r"field 'quantization_config\.config_groups\.g\.weights\.strategy' is 'group'",
        ),
        (
            {
                "quantization_config": {
                    **qc,
                    "format": "int-quantized",
                    "config_groups": {
                        "g": {
                            "targets": ["Linear"],
                            "weights": {
                                "num_bits": 8,
                                "type": "int",
                                "symmetric": False,
                                "strategy": "channel",
                            },
                        }
                    },
                }
            },
            r"int-quantized supports symmetric per-channel int8 only",
        ),
    ]
    for i, (changes, message) in enumerate(cases):
        out = tmp_path / f"c{i}"
        shutil.copytree(folder, out)
        (out / "config.json").write_text(json.dumps({**cfg, **changes}))
        with pytest.raises(InputError, match=message):
            import_hf(out, require_tokenizer=False)


def test_fp8_scale_shape_error(checkpoints: dict[str, Any], tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path / "m"
    shutil.copytree(checkpoints["ct-fp8-tensor"][0], out)
    t = load_file(str(out / "model.safetensors"))
    t["model.layers.0.mlp.up_proj.weight_scale"] = torch.ones(3)
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(
        InputError,
        match=r"tensor 'model\.layers\.0\.mlp\.up_proj\.weight_scale' has shape \[3\]: "
        r"expected a per-tensor \[1\] or per-channel \[96, 1\] scale",
    ):
        import_hf(out, require_tokenizer=False)


def _infer(name: str, types: list[str], **attrs: Any) -> list[str]:
    from llmir_core.builder import Builder
    from llmir_core.ir.core import Function
    from llmir_core.ir.typeparse import parse_type_text

    b = Builder(Function("main", []))
    args = [b.arg(f"a{i}", parse_type_text(t)) for i, t in enumerate(types)]
    return [str(r.type) for r in b.create(name, args, attrs).results]


def test_dequantize_operands_are_checked() -> None:
    """llm.dequantize of the int32-packed formats: operand shapes and dtypes per scheme."""
    g = "tensor<64x128x!quant<gptq, bits=4, block=32, scale=f16, zero=int>>"
    assert _infer(
        "llm.dequantize", [g, "tensor<4x64xf16>", "tensor<4x8xi32>", "tensor<128xi32>"]
    ) == ["tensor<64x128xf32>"]
    ct = "tensor<64x128x!quant<ctpack, bits=8, block=128, scale=bf16, zero=none>>"
    assert _infer("llm.dequantize", [ct, "tensor<64x1xbf16>"]) == ["tensor<64x128xf32>"]
    bad = [
        (
            [g, "tensor<4x64xf16>"],
            "gptq with zero=int takes scales, zero_points and an optional g_idx",
        ),
        (
            [g, "tensor<64x4xf16>", "tensor<4x8xi32>"],
            r"scales has shape \[64, 4\], expected \[4, 64\]",
        ),
        ([g, "tensor<4x64xf32>", "tensor<4x8xi32>"], "scales"),
        ([g, "tensor<4x64xf16>", "tensor<4x8xu8>"], "zero_points"),
        (
            [g, "tensor<4x64xf16>", "tensor<4x8xi32>", "tensor<64xi32>"],
            r"g_idx has shape \[64\], expected \[128\]",
        ),
        (
            [
                "tensor<64x128x!quant<awq, bits=8, block=32, scale=f16, zero=int>>",
                "tensor<4x64xf16>",
                "tensor<4x16xi32>",
            ],
            "AWQ GEMM packing is defined for 4 bits only",
        ),
        (
            [
                "tensor<64x128x!quant<gptq, bits=4, block=32, scale=f16, zero=none>>",
                "tensor<4x64xf16>",
            ],
            "gptq zero must be int, got none",
        ),
        (
            [
                "tensor<2x64x128x!quant<ctpack, bits=4, block=32, scale=f16, zero=none>>",
                "tensor<64x4xf16>",
            ],
            "ctpack weights are 2-D",
        ),
    ]
    for types, message in bad:
        with pytest.raises(Exception, match=message):
            _infer("llm.dequantize", types)
    with pytest.raises(Exception, match="gptq is a checkpoint storage format"):
        _infer(
            "llm.quantize",
            ["tensor<64x128xf32>"],
            format=QuantType("gptq", 4, 32, DType.f16, "int"),
        )
