"""Pre-quantized Hugging Face checkpoints (the formats vLLM serves), imported packed.

`quantization_config` in config.json selects the format:

- `quant_method: gptq` (AutoGPTQ / GPTQModel / transformers+optimum): `bits` 2/4/8,
  `group_size` (-1: one group per output row), `sym`, `desc_act` (act-order: the `g_idx` tensor
  gives each input column's group), `checkpoint_format` "gptq" (zero points stored minus one) or
  "gptq_v2". Tensors per linear layer: `qweight`, `qzeros`, `scales`, `g_idx`.
- `quant_method: awq` (AutoAWQ), `version` "gemm", 4 bits, `group_size`/`q_group_size`, with zero
  points. Tensors: `qweight`, `qzeros`, `scales`.
- `quant_method: compressed-tensors` (llm-compressor), formats `pack-quantized` (int weights
  `weight_packed`, `weight_scale`, `weight_zero_point` when asymmetric, `weight_shape`, and
  `weight_g_idx` with act-order), `int-quantized`/`naive-quantized` (an int8 `weight` and its
  `weight_scale`) and `float-quantized` (an f8e4m3 `weight` with a per-tensor or per-channel
  `weight_scale`). `config_groups` map modules to schemes by `targets` (`Linear`, a module name,
  or `re:` + a regular expression); `ignore` lists modules kept in float. Activation
  quantization (W8A8 `input_activations`) is not applied: the imported model computes with float
  activations, as a weight-only model.

Packed formats become a `core.weight` of an int32-packed `!quant<gptq|gptq_v2|awq|ctpack, ...>`
type over the checkpoint's own bytes (file + offset, nothing read or copied), its scales, zero
points and g_idx as plain `core.weight`s, and one `llm.dequantize` to f32. int8/f8 weights are a
`core.weight` of their dtype, `core.cast` to f32 and `core.mul` by the scale. Every error names
config.json's field or the tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from llmir_core.builder import Builder
from llmir_core.errors import InputError
from llmir_core.ir.core import Value
from llmir_core.ir.types import DType, QuantType, TensorType
from llmir_core.quant import int32_packed

from .safetensors_index import SafetensorsIndex, TensorEntry

METHODS = ("gptq", "awq", "compressed-tensors")
CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
# what each checkpoint kind becomes: (checkpoint, in the IR, in the onnxruntime build); the
# table in docs/llm-import.md is `format_table()` (a test checks it)
FORMAT_TABLE = (
    (
        "GPTQ (`gptq`, `gptq_v2`): 2/4/8 bits, sym/asym, groups or per-channel, act-order `g_idx`",
        "`!quant<gptq, ...>` or `!quant<gptq_v2, ...>` over the stored `qweight` + `scales`, `qzeros`, `g_idx`",
        "MatMulNBits, lossless when 4/8 bits, the group a power of two >= 16 dividing K, no "
        "act-order and every zero <= 2**bits - 1; otherwise requantized (int4/int8, error in the "
        "manifest)",
    ),
    (
        "AWQ GEMM: 4 bits, groups, zero points",
        "`!quant<awq, ...>` over the stored `qweight` + `scales`, `qzeros`",
        "MatMulNBits, lossless for power-of-two groups >= 16; otherwise requantized",
    ),
    (
        "compressed-tensors `pack-quantized` (W4A16, W8A16): int2/4/8, sym/asym, group/channel",
        "`!quant<ctpack, ...>` over the stored `weight_packed` + `weight_scale`, `weight_zero_point`",
        "MatMulNBits, lossless under GPTQ's conditions; otherwise requantized",
    ),
    (
        "compressed-tensors `int-quantized`/`naive-quantized` int8 (W8A8: weights only)",
        "i8 `weight`, `core.cast`, `core.mul` by `weight_scale`",
        "f32 weights (exact), or `--quant`",
    ),
    (
        "compressed-tensors `float-quantized` FP8 e4m3, per-tensor or per-channel scale",
        "f8e4m3 `weight`, `core.cast`, `core.mul` by `weight_scale`",
        "f32 weights (exact), or `--quant`",
    ),
)


def format_table() -> str:
    """The markdown table of FORMAT_TABLE."""
    rows = ["| checkpoint | imported as | onnxruntime build |", "|---|---|---|"]
    rows += [f"| {a} | {b} | {c} |" for a, b, c in FORMAT_TABLE]
    return "\n".join(rows) + "\n"


@dataclass
class _Scheme:
    kind: str  # gptq | gptq_v2 | awq | ctpack | scaled
    bits: int
    group: int  # -1: per output row
    sym: bool
    act_order: bool = False


@dataclass
class QuantConfig:
    method: str
    fmt: str
    default: _Scheme | None
    groups: list[tuple[list[str], _Scheme]] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)

    def scheme_for(self, module: str) -> _Scheme | None:
        if self.method != "compressed-tensors":
            return self.default
        if any(_matches(t, module) for t in self.ignore):
            return None
        for targets, sch in self.groups:
            if any(_matches(t, module) for t in targets):
                return sch
        return None

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "format": self.fmt}
        schemes = ([self.default] if self.default else []) + [s for _, s in self.groups]
        if schemes:
            s = schemes[0]
            out.update(bits=s.bits, group_size=s.group, symmetric=s.sym, act_order=s.act_order)
        return out


def _matches(target: str, module: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    if target == "Linear":
        return True  # every projection a decoder layer has is a Linear
    return module == target or module.endswith("." + target)


def parse(cfg: Any) -> QuantConfig | None:
    """`quantization_config` of config.json (a `_Cfg`), or None when absent."""
    qc = cfg.data.get("quantization_config")
    if not qc:
        return None
    f = "quantization_config"
    if not isinstance(qc, dict):
        raise cfg.fail(f, "must be an object")
    method = str(qc.get("quant_method", "")).lower()
    if method not in METHODS:
        raise cfg.fail(
            f"{f}.quant_method",
            f"is '{qc.get('quant_method')}', which is not supported",
            hint=f"supported: {', '.join(METHODS)}",
        )
    if cfg.arch == "phi3":
        raise cfg.fail(
            f,
            "is set on a phi3 model (fused projections): pre-quantized phi3 "
            "checkpoints are not supported",
        )
    if method == "gptq":
        fmt = str(qc.get("checkpoint_format") or "gptq")
        if qc.get("is_marlin_format") or fmt not in ("gptq", "gptq_v2"):
            raise cfg.fail(
                f"{f}.checkpoint_format", f"is '{fmt}': only gptq and gptq_v2 are supported"
            )
        bits = _int(cfg, qc, "bits")
        sch = _Scheme(
            fmt,
            bits,
            _int(cfg, qc, "group_size", -1),
            bool(qc.get("sym", True)),
            bool(qc.get("desc_act", False)),
        )
        _check_bits(cfg, f"{f}.bits", bits, (2, 4, 8))
        return QuantConfig(method, fmt, sch)
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise cfg.fail(
                f"{f}.version", f"is '{qc.get('version')}': only the GEMM packing is supported"
            )
        if qc.get("zero_point") is False:
            raise cfg.fail(f"{f}.zero_point", "is false: AWQ without zero points is not supported")
        key = "bits" if "bits" in qc else "w_bit"
        bits = _int(cfg, qc, key)
        _check_bits(cfg, f"{f}.{key}", bits, (4,))
        gkey = "group_size" if "group_size" in qc else "q_group_size"
        return QuantConfig(method, "gemm", _Scheme("awq", bits, _int(cfg, qc, gkey, -1), False))
    return _parse_ct(cfg, qc)


def _int(cfg: Any, qc: dict[str, Any], key: str, default: int | None = None) -> int:
    v = qc.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise cfg.fail(f"quantization_config.{key}", f"must be an integer, got {v!r}")
    return v


def _check_bits(cfg: Any, field_name: str, bits: int, allowed: tuple[int, ...]) -> None:
    if bits not in allowed:
        raise cfg.fail(field_name, f"is {bits}: supported {', '.join(map(str, allowed))}")


def _parse_ct(cfg: Any, qc: dict[str, Any]) -> QuantConfig:
    f = "quantization_config"
    fmt = qc.get("format")
    if fmt not in CT_FORMATS:
        raise cfg.fail(
            f"{f}.format",
            f"is {fmt!r}, which is not supported",
            hint=f"supported compressed-tensors formats: {', '.join(CT_FORMATS)}",
        )
    if qc.get("sparsity_config"):
        raise cfg.fail(
            f"{f}.sparsity_config",
            "is set: sparse compressed-tensors checkpoints are not supported",
        )
    groups: list[tuple[list[str], _Scheme]] = []
    cgs = qc.get("config_groups")
    if not isinstance(cgs, dict) or not cgs:
        raise cfg.fail(f"{f}.config_groups", "must be a non-empty object")
    for gname, g in cgs.items():
        gf = f"{f}.config_groups.{gname}"
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            raise cfg.fail(f"{gf}.weights", "must be an object")
        targets = g.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise cfg.fail(f"{gf}.targets", "must be a list of strings")
        bits = _int(cfg, w, "num_bits")
        wtype = w.get("type", "int")
        strategy = w.get("strategy", "tensor")
        if fmt == "float-quantized":
            if wtype != "float" or bits != 8:
                raise cfg.fail(
                    f"{gf}.weights", f"is {wtype}{bits}: float-quantized supports float8 only"
                )
            if strategy not in ("tensor", "channel"):
                raise cfg.fail(
                    f"{gf}.weights.strategy", f"is '{strategy}': float8 supports tensor or channel"
                )
            groups.append((targets, _Scheme("scaled", 8, -1, True)))
            continue
        if wtype != "int":
            raise cfg.fail(f"{gf}.weights.type", f"is '{wtype}': {fmt} needs int weights")
        sym = bool(w.get("symmetric", True))
        if strategy == "group":
            gs = _int(cfg, w, "group_size")
        elif strategy == "channel":
            gs = -1
        else:
            raise cfg.fail(f"{gf}.weights.strategy", f"is '{strategy}': supported group, channel")
        actorder = w.get("actorder")
        if fmt == "pack-quantized":
            _check_bits(cfg, f"{gf}.weights.num_bits", bits, (2, 4, 8))
            groups.append(
                (targets, _Scheme("ctpack", bits, gs, sym, actorder not in (None, False)))
            )
        else:
            if bits != 8 or not sym or strategy != "channel":
                raise cfg.fail(f"{gf}.weights", f"{fmt} supports symmetric per-channel int8 only")
            groups.append((targets, _Scheme("scaled", 8, -1, True)))
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list):
        raise cfg.fail(f"{f}.ignore", "must be a list of module names")
    return QuantConfig("compressed-tensors", str(fmt), None, groups, [str(x) for x in ignore])


# -- emitting the weights -----------------------------------------------------------------------


def _ref(b: Builder, e: TensorEntry, t: TensorType, base_dir: str | None) -> Value:
    from .hf import weight_file_attr

    attrs = {
        "file": weight_file_attr(e.file, base_dir),
        "name": e.name,
        "offset": e.offset,
        "nbytes": e.nbytes,
    }
    return b.create("core.weight", [], attrs, result_types=[t], names=[e.name]).results[0]


def _plain(b: Builder, e: TensorEntry, base_dir: str | None) -> Value:
    return _ref(b, e, TensorType(e.shape, e.dtype), base_dir)


def _need(
    index: SafetensorsIndex, name: str, shape: tuple[int, ...] | None, dtypes: tuple[DType, ...]
) -> TensorEntry:
    e = index.get(name)
    if e.dtype not in dtypes:
        raise InputError(
            f"{e.file}: tensor '{name}' has dtype {e.dtype}, expected "
            f"{' or '.join(str(d) for d in dtypes)}",
            hint="the checkpoint does not match its quantization_config",
        )
    if shape is not None and e.shape != shape:
        raise InputError(
            f"{e.file}: tensor '{name}' has shape {list(e.shape)}, expected {list(shape)} "
            "from config.json and quantization_config",
            hint="the checkpoint does not match its quantization_config",
        )
    return e


def quantized_weight(
    b: Builder,
    index: SafetensorsIndex,
    qc: QuantConfig,
    module: str,
    shape: tuple[int, int],
    base_dir: str | None,
) -> Value | None:
    """The f32 value of `module`'s quantized weight [N, K], or None when the module is stored
    in float (not quantized by the checkpoint)."""
    sch = qc.scheme_for(module)
    if sch is None:
        return None
    n, k = shape
    if sch.kind == "scaled":
        if f"{module}.weight_scale" not in index:
            return None
        w = _need(index, f"{module}.weight", shape, (DType.i8, DType.f8e4m3))
        s = _need(index, f"{module}.weight_scale", None, (DType.f32, DType.f16, DType.bf16))
        if s.shape not in ((), (1,), (n, 1)):
            raise InputError(
                f"{s.file}: tensor '{s.name}' has shape {list(s.shape)}: expected a "
                f"per-tensor [1] or per-channel [{n}, 1] scale"
            )
        v = b.op("core.cast", _plain(b, w, base_dir), to=DType.f32, name_hint=w.name + ".f32")
        sv = _plain(b, s, base_dir)
        if s.dtype != DType.f32:
            sv = b.op("core.cast", sv, to=DType.f32, name_hint=s.name + ".f32")
        return b.op("core.mul", v, sv, name_hint=w.name + ".dq")
    if sch.kind == "ctpack":
        pname, sname, zname, gname = (
            f"{module}.weight_packed",
            f"{module}.weight_scale",
            f"{module}.weight_zero_point",
            f"{module}.weight_g_idx",
        )
        if pname not in index:
            return None
    else:
        pname, sname, zname, gname = (
            f"{module}.qweight",
            f"{module}.scales",
            f"{module}.qzeros",
            f"{module}.g_idx",
        )
        if pname not in index:
            return None
    block = k if sch.group == -1 else sch.group
    why = int32_packed.check_layout(sch.kind, sch.bits, n, k, block)
    p0 = index.get(pname)
    if why:
        raise InputError(
            f"{p0.file}: tensor '{pname}' cannot hold a [{n}, {k}] weight in "
            f"{sch.kind} layout: {why}"
        )
    want = int32_packed.shapes(sch.kind, sch.bits, n, k, block)
    p = _need(index, pname, want["packed"], (DType.i32,))
    s = _need(index, sname, want["scales"], (DType.f16, DType.bf16, DType.f32))
    zero = "none" if sch.kind == "ctpack" and sch.sym else "int"
    qt = QuantType(sch.kind, sch.bits, block, s.dtype, zero)
    operands = [_ref(b, p, TensorType((n, k), qt), base_dir), _plain(b, s, base_dir)]
    if zero == "int":
        operands.append(_plain(b, _need(index, zname, want["zeros"], (DType.i32,)), base_dir))
    if gname in index:
        operands.append(_plain(b, _need(index, gname, (k,), (DType.i32,)), base_dir))
    elif sch.act_order:
        raise InputError(
            f"{p.file}: tensor '{gname}' is missing, but quantization_config asks "
            "for act-order (desc_act / actorder)"
        )
    if sch.kind == "ctpack" and f"{module}.weight_shape" in index:
        _need(index, f"{module}.weight_shape", (2,), (DType.i32, DType.i64))
    return b.op("llm.dequantize", *operands, dtype=DType.f32, name_hint=module + ".weight.f32")


__all__ = [
    "QuantConfig",
    "parse",
    "quantized_weight",
    "METHODS",
    "CT_FORMATS",
    "FORMAT_TABLE",
    "format_table",
]
