"""Import a Hugging Face model folder (config.json + safetensors) as an llmir decoder.

Reads `config.json` (transformers 4.x fields `rope_theta`/`rope_scaling` and 5.x
`rope_parameters`), indexes the safetensors files without reading tensor data, and emits the
decoder of `llm_graph` with `core.weight` ops that reference each tensor by absolute byte offset.
`generation_config.json`, `tokenizer.json` and the chat template (`tokenizer_config.json` or
`chat_template.jinja`) become module attributes. Pre-quantized GPTQ, AWQ and compressed-tensors
checkpoints keep their packed weights (`hf_quant`). Architectures: llama, mistral, qwen2, qwen3,
phi3, gemma2, gemma3_text (local/global layers with their own rope, q/k norms), and the
mixture-of-experts families in `hf_moe`; rope types default, linear, dynamic, llama3, yarn,
longrope (see `rope`), per layer type where the config says so. Anything else that would change
the model's meaning is an `InputError` naming the file and the field.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from llmir_core.builder import Builder
from llmir_core.errors import InputError
from llmir_core.fileio import read_json, read_text
from llmir_core.ir.core import Module, Value
from llmir_core.ir.types import DType, TensorType

from . import hf_quant
from .hf_deepseek import configure_mla
from .hf_defaults import DEFAULTS
from .hf_moe import MOE_ARCHS, moe_layers, moe_weights
from .llm_graph import DecoderConfig, RopeSpec, build_decoder
from .rope import ROPE_TYPES, RopeParams, rope_spec_from
from .safetensors_index import SafetensorsIndex, TensorEntry, open_index
from .validate_config import check_hf_config
from .validate_tokenizer import check_tokenizer_json

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", *MOE_ARCHS)

_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}
_GENERATION_KEYS = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_length",
    "max_new_tokens",
)


class _Cfg:
    """config.json with per-architecture defaults; a missing required field names itself."""

    def __init__(self, path: Path, data: dict[str, Any], arch: str) -> None:
        self.path, self.data, self.arch = path, data, arch

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value; the class default only when absent (null means none: sliding_window)."""
        if key in self.data:
            return self.data[key]
        return DEFAULTS[self.arch].get(key, default)

    def num(self, key: str) -> float:
        v = self.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise self.fail(key, f"must be a number, got {v!r}")
        return v

    def has(self, key: str) -> bool:
        return key in self.data

    def req(self, key: str) -> Any:
        v = self.data.get(key)
        if v is None:
            raise InputError(
                f"{self.path}: field '{key}' is missing",
                hint=f"a {self.arch} config.json must set {key}",
            )
        return v

    def fail(self, field: str, message: str, hint: str | None = None) -> InputError:
        return InputError(f"{self.path}: field '{field}' {message}", hint=hint)


def _read_json(path: Path) -> Any:
    """A JSON file's value; a syntax error or a byte that is not UTF-8 at `file:line:col`."""
    return read_json(path)


def read_config(folder: Path) -> _Cfg:
    path = folder / "config.json"
    if not path.is_file():
        raise InputError(
            f"{folder}: no config.json",
            hint="point at a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer.json)",
        )
    data = _read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: must be a JSON object")
    mt = data.get("model_type")
    if mt not in ARCHITECTURES:
        archs = data.get("architectures")
        shown = f"model_type '{mt}'" + (f" (architectures {archs})" if archs else "")
        raise InputError(
            f"{path}: field 'model_type': {shown} is not supported",
            hint=f"supported architectures: {', '.join(ARCHITECTURES)}",
        )
    return _Cfg(path, data, mt)


# -- rope -----------------------------------------------------------------------------------


def _rope_params(cfg: _Cfg) -> tuple[str, dict[str | None, dict[str, Any]]]:
    """The rope dicts (5.x `rope_parameters`, or 4.x `rope_theta` + `rope_scaling`) by layer type
    (None: every layer), and the field they came from."""
    rp = cfg.data.get("rope_parameters")
    partial = cfg.data.get("partial_rotary_factor")
    if isinstance(rp, dict) and rp:
        if all(isinstance(v, dict) for v in rp.values()):
            return "rope_parameters", {
                k: {"rope_theta": cfg.get("rope_theta"), **v} for k, v in rp.items()
            }
        return "rope_parameters", {None: dict(rp)}
    params: dict[str, Any] = {"rope_theta": cfg.get("rope_theta")}
    if partial is not None:
        params["partial_rotary_factor"] = partial
    scaling = cfg.data.get("rope_scaling")
    field = "rope_theta"
    if isinstance(scaling, dict):
        params.update(scaling)
        field = "rope_scaling"
    if cfg.arch == "gemma3_text":  # 4.x: local layers use their own base and no scaling
        local = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq")}
        return field, {"full_attention": params, "sliding_attention": local}
    return field, {None: params}


def rope_spec(
    cfg: _Cfg, head_dim: int, params: dict[str, Any] | None = None, field: str | None = None
) -> RopeSpec:
    if params is None or field is None:
        field, sets = _rope_params(cfg)
        params = next(iter(sets.values()))
    rtype = params.get("rope_type") or params.get("type") or "default"
    if rtype not in ROPE_TYPES:
        raise cfg.fail(
            f"{field}.rope_type",
            f"is '{rtype}', which is not supported",
            hint=f"supported rope types: {', '.join(ROPE_TYPES)}",
        )
    params = {**params, "rope_theta": params.get("rope_theta") or cfg.get("rope_theta") or 10000.0}
    partial = params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0
    rdim = int(head_dim * partial)
    if rdim % 2 or rdim <= 0:
        raise cfg.fail("partial_rotary_factor", f"gives an odd rotary dimension {rdim}")
    original = cfg.data.get("original_max_position_embeddings")
    rp = RopeParams(
        params,
        field,
        str(cfg.path),
        rdim,
        int(cfg.num("max_position_embeddings")),
        int(original)
        if isinstance(original, int) and rtype in ("llama3", "yarn", "longrope")
        else None,
    )
    return rope_spec_from(str(rtype), rp)


def rope_specs(cfg: _Cfg, head_dim: int, layer_types: list[str]) -> list[RopeSpec]:
    """One RopeSpec per layer: per layer type where the config gives rope parameters per type."""
    field, sets = _rope_params(cfg)
    if None in sets:
        spec = rope_spec(cfg, head_dim, sets[None], field)
        return [spec] * len(layer_types)
    specs: dict[str, RopeSpec] = {}
    for t in dict.fromkeys(layer_types):
        if t not in sets or not isinstance(sets[t], dict):
            raise cfg.fail(field, f"gives no rope parameters for layer type '{t}'")
        specs[t] = rope_spec(cfg, head_dim, sets[t], f"{field}.{t}")
    return [specs[t] for t in layer_types]


# -- config -> DecoderConfig --------------------------------------------------------------------


def _check_unsupported(cfg: _Cfg) -> None:
    d = cfg.data
    hf_quant.parse(cfg)  # GPTQ / AWQ / compressed-tensors: a bad quantization_config fails here
    if d.get("mlp_bias"):
        raise cfg.fail("mlp_bias", "is true, which is not supported")
    if d.get("use_bidirectional_attention"):
        raise cfg.fail("use_bidirectional_attention", "is true: only causal decoders are supported")
    if cfg.arch in ("mistral", "mixtral") and d.get("attention_bias"):
        raise cfg.fail("attention_bias", "is true, which is not supported for mistral")


def _layer_types(cfg: _Cfg, layers: int) -> list[str]:
    """`layer_types` as given, or as the class derives it (gemma3: every Nth layer global)."""
    types = cfg.data.get("layer_types")
    if isinstance(types, list):
        return [str(t) for t in types]
    if cfg.arch == "gemma3_text":
        n = int(cfg.get("sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers)]
    return ["full_attention"] * layers


def _layer_windows(cfg: _Cfg, layers: int) -> list[int]:
    window = cfg.get("sliding_window") or 0
    types = cfg.data.get("layer_types")
    if types is None and cfg.arch == "gemma3_text":
        types = _layer_types(cfg, layers)
    if isinstance(types, list):
        if len(types) != layers:
            raise cfg.fail("layer_types", f"has {len(types)} entries for {layers} layers")
        bad = [t for t in types if t not in ("full_attention", "sliding_attention")]
        if bad:
            raise cfg.fail("layer_types", f"names layer type '{bad[0]}', which is not supported")
        if "sliding_attention" in types and not window:
            raise cfg.fail(
                "sliding_window", "is missing but layer_types has sliding_attention layers"
            )
        return [int(window) if t == "sliding_attention" else 0 for t in types]
    base = MOE_ARCHS.get(cfg.arch, cfg.arch)
    if base in ("mistral", "phi3"):
        return [int(window)] * layers
    if base in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window"):
            return [0] * layers
        first = int(cfg.get("max_window_layers") or 0)
        return [int(window) if i >= first else 0 for i in range(layers)]
    if cfg.arch == "gemma2":
        return [int(window) if i % 2 == 0 else 0 for i in range(layers)]
    return [0] * layers


def decoder_config(cfg: _Cfg) -> DecoderConfig:
    _check_unsupported(cfg)
    arch = cfg.arch
    hidden, heads = int(cfg.req("hidden_size")), int(cfg.req("num_attention_heads"))
    layers = int(cfg.req("num_hidden_layers"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if heads % kv_heads:
        raise cfg.fail(
            "num_key_value_heads", f"({kv_heads}) does not divide num_attention_heads ({heads})"
        )
    act_field = "hidden_activation" if arch in ("gemma2", "gemma3_text") else "hidden_act"
    act_name = cfg.get(act_field) or cfg.get("hidden_act")
    if act_name not in _ACTIVATIONS:
        raise cfg.fail(
            act_field,
            f"is '{act_name}', which is not supported",
            hint=f"supported: {', '.join(_ACTIVATIONS)}",
        )
    rope = rope_specs(cfg, head_dim, _layer_types(cfg, layers))
    dc = DecoderConfig(
        arch=arch,
        vocab=int(cfg.req("vocab_size")),
        hidden=hidden,
        intermediate=int(cfg.req("intermediate_size")),
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        eps=float(cfg.num("rms_norm_eps")),
        context=int(cfg.num("max_position_embeddings")),
        rope=rope,
        activation=_ACTIVATIONS[act_name],
        tie_embeddings=bool(cfg.get("tie_word_embeddings")),
        sliding_window=_layer_windows(cfg, layers),
    )
    base = MOE_ARCHS.get(arch, arch)
    if base == "qwen2":
        dc.qkv_bias = True
    elif base in ("llama", "qwen3"):
        dc.qkv_bias = dc.o_bias = bool(cfg.get("attention_bias", False))
    if base == "qwen3":
        dc.qk_norm = True
    if arch in MOE_ARCHS:
        dc.moe = moe_layers(cfg, layers, dc.intermediate)
    if arch == "deepseek_v2":
        configure_mla(cfg, dc)
    if arch == "gemma3_text":
        dc.qk_norm = True
        dc.qkv_bias = dc.o_bias = bool(cfg.get("attention_bias", False))
    if arch in ("gemma2", "gemma3_text"):
        dc.norm_offset = 1.0
        dc.sandwich_norms = True
        dc.embed_scale = float(np.float32(math.sqrt(hidden)))
        dc.attn_scale = float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5
        dc.attn_softcap = float(cfg.get("attn_logit_softcapping") or 0.0)
        dc.final_softcap = float(cfg.get("final_logit_softcapping") or 0.0)
    return dc


# -- weights --------------------------------------------------------------------------------

_TOP = {
    "model.embed_tokens": "model.embed_tokens.weight",
    "model.norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}
# phi3 fuses projections: key -> (fused tensor key, part index); parts are row blocks
_PHI3_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


class HFWeights:
    """Weight references into safetensors files, by absolute offset (no tensor data is read)."""

    def __init__(
        self,
        index: SafetensorsIndex,
        dc: DecoderConfig,
        base_dir: str | None,
        prefix: str = "hf:",
        quant: hf_quant.QuantConfig | None = None,
    ) -> None:
        self.index, self.dc, self.base_dir, self.prefix = index, dc, base_dir, prefix
        self.quant = quant
        self._cache: dict[tuple[str, int | None], Value] = {}

    # shapes each parameter must have ([out, in] for projections)
    def _expected(self, key: str) -> tuple[int, ...]:
        dc = self.dc
        q, kv = dc.heads * dc.head_dim, dc.kv_heads * dc.head_dim
        table = {
            "model.embed_tokens": (dc.vocab, dc.hidden),
            "lm_head": (dc.vocab, dc.hidden),
            "model.norm": (dc.hidden,),
            "input_layernorm": (dc.hidden,),
            "post_attention_layernorm": (dc.hidden,),
            "pre_feedforward_layernorm": (dc.hidden,),
            "post_feedforward_layernorm": (dc.hidden,),
            "self_attn.q_proj": (q, dc.hidden),
            "self_attn.k_proj": (kv, dc.hidden),
            "self_attn.v_proj": (kv, dc.hidden),
            "self_attn.o_proj": (dc.hidden, q),
            "self_attn.q_proj.bias": (q,),
            "self_attn.k_proj.bias": (kv,),
            "self_attn.v_proj.bias": (kv,),
            "self_attn.o_proj.bias": (dc.hidden,),
            "self_attn.q_norm": (dc.head_dim,),
            "self_attn.k_norm": (dc.head_dim,),
            "mlp.gate_proj": (dc.intermediate, dc.hidden),
            "mlp.up_proj": (dc.intermediate, dc.hidden),
            "mlp.down_proj": (dc.hidden, dc.intermediate),
            "self_attn.qkv_proj": (q + 2 * kv, dc.hidden),
            "mlp.gate_up_proj": (2 * dc.intermediate, dc.hidden),
        }
        return table[key]

    def _tensor_name(self, key: str, layer: int | None) -> str:
        if layer is None:
            return _TOP[key]
        suffix = "" if key.endswith(".bias") else ".weight"
        return f"model.layers.{layer}.{key}{suffix}"

    def _module(self, key: str, layer: int | None) -> str:
        if self.dc.arch == "phi3" and key in _PHI3_FUSED:
            key = _PHI3_FUSED[key][0]
        key = key.removesuffix(".bias")
        return key if layer is None else f"model.layers.{layer}.{key}"

    def has(self, key: str, layer: int | None = None) -> bool:
        return self._tensor_name(key, layer) in self.index

    def origin(self, key: str, layer: int | None = None) -> str:
        return self.prefix + self._module(key, layer)

    def _entry(self, key: str, layer: int | None) -> TensorEntry:
        if self.dc.arch == "phi3" and key in _PHI3_FUSED:
            fused, part = _PHI3_FUSED[key]
            whole = self._checked(fused, layer)
            dc = self.dc
            sizes = (
                [dc.heads * dc.head_dim, dc.kv_heads * dc.head_dim, dc.kv_heads * dc.head_dim]
                if fused == "self_attn.qkv_proj"
                else [dc.intermediate, dc.intermediate]
            )
            return _row_slice(whole, sum(sizes[:part]), sizes[part], key)
        return self._checked(key, layer)

    def _checked(self, key: str, layer: int | None) -> TensorEntry:
        e = self.index.get(self._tensor_name(key, layer))
        want = self._expected(key)
        if e.shape != want:
            raise InputError(
                f"{e.file}: tensor '{e.name}' has shape {list(e.shape)}, but config.json "
                f"implies {list(want)}",
                hint="config.json and the weights do not match",
            )
        return e

    def weight(self, b: Builder, key: str, layer: int | None = None) -> Value:
        ck = (key, layer)
        if ck in self._cache:
            return self._cache[ck]
        shape = self._expected(key)
        if self.quant is not None and len(shape) == 2 and key != "model.embed_tokens":
            qv = hf_quant.quantized_weight(
                b,
                self.index,
                self.quant,
                self._module(key, layer),
                (shape[0], shape[1]),
                self.base_dir,
            )
            if qv is not None:
                self._cache[ck] = qv
                return qv
        e = self._entry(key, layer)
        v = emit_weight(b, e, self.base_dir)
        if e.dtype != DType.f32:
            v = b.op("core.cast", v, to=DType.f32, name_hint=e.name + ".f32")
        self._cache[ck] = v
        return v


def _row_slice(e: TensorEntry, row0: int, rows: int, key: str) -> TensorEntry:
    row_bytes = e.nbytes // e.shape[0]
    # a row block of a fused tensor is named NAME[r0:r1] (one name, one byte range)
    return TensorEntry(
        f"{e.name}[{row0}:{row0 + rows}]",
        e.file,
        e.dtype,
        (rows,) + e.shape[1:],
        e.offset + row0 * row_bytes,
        rows * row_bytes,
    )


def weight_file_attr(path: str, base_dir: str | None) -> str:
    """A weight's `file` attribute: relative to the .llmir file's folder when known, else absolute."""
    if base_dir is None:
        return os.path.abspath(path)
    return os.path.relpath(os.path.abspath(path), os.path.abspath(base_dir))


def emit_weight(b: Builder, e: TensorEntry, base_dir: str | None) -> Value:
    attrs = {
        "file": weight_file_attr(e.file, base_dir),
        "name": e.name,
        "offset": e.offset,
        "nbytes": e.nbytes,
    }
    op = b.create(
        "core.weight", [], attrs, result_types=[TensorType(e.shape, e.dtype)], names=[e.name]
    )
    return op.results[0]


# -- tokenizer, chat template, generation config ----------------------------------------------


def _token_ids(v: Any) -> tuple[int, ...]:
    if isinstance(v, bool) or v is None:
        return ()
    if isinstance(v, int):
        return (v,)
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v if isinstance(x, int) and not isinstance(x, bool))
    return ()


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return read_text(jinja)
    tc = folder / "tokenizer_config.json"
    if not tc.is_file():
        return None
    data = _read_json(tc)
    t = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    return t if isinstance(t, str) else None


def model_attributes(
    folder: Path, cfg: _Cfg, dc: DecoderConfig, base_dir: str | None, require_tokenizer: bool
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "llm.architecture": dc.arch,
        "llm.source": "hf",
        "llm.context_length": dc.context,
        "llm.vocab_size": dc.vocab,
        "llm.num_layers": dc.layers,
    }
    gen: dict[str, Any] = {}
    gpath = folder / "generation_config.json"
    if gpath.is_file():
        data = _read_json(gpath)
        if isinstance(data, dict):
            for k in _GENERATION_KEYS:
                v = data.get(k)
                if isinstance(v, (bool, int, float, str)):
                    gen[k] = v
                elif isinstance(v, list) and all(isinstance(x, int) for x in v):
                    gen[k] = tuple(v)
    eos = _token_ids(gen.get("eos_token_id")) or _token_ids(cfg.data.get("eos_token_id"))
    bos = _token_ids(gen.get("bos_token_id")) or _token_ids(cfg.data.get("bos_token_id"))
    attrs["llm.eos_token_ids"] = eos
    attrs["llm.bos_token_id"] = bos[0] if bos else None
    if gen:
        attrs["llm.generation"] = gen
    tok = folder / "tokenizer.json"
    if tok.is_file() and require_tokenizer:  # --no-tokenizer: the module takes token ids only
        check_tokenizer_json(tok)
        attrs["llm.tokenizer"] = {"format": "hf", "file": weight_file_attr(str(tok), base_dir)}
    elif require_tokenizer:
        extra = (
            " (tokenizer.model alone needs sentencepiece: save the tokenizer with transformers "
            "to get tokenizer.json)"
            if (folder / "tokenizer.model").is_file()
            else ""
        )
        raise InputError(
            f"{folder}: tokenizer.json is missing{extra}",
            hint="copy the model's tokenizer.json into the folder, or import with "
            "--no-tokenizer to build a model that takes token ids",
        )
    template = _chat_template(folder)
    if template:
        attrs["llm.chat_template"] = template
    return attrs


def import_hf(
    path: str | os.PathLike[str],
    out_path: str | os.PathLike[str] | None = None,
    require_tokenizer: bool = True,
) -> Module:
    """Import the model folder at `path`; weight paths are relative to `out_path`'s folder if given."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder", hint="point at a Hugging Face model folder")
    cfg = read_config(folder)
    index = open_index(folder)
    _check_unsupported(cfg)
    check_hf_config(
        cfg,
        ((e.name, e.shape) for e in index.tensors.values()),
        ", ".join(os.path.basename(f) for f in index.files),
    )
    dc = decoder_config(cfg)
    base_dir = os.path.dirname(os.path.abspath(out_path)) if out_path is not None else None
    quant = hf_quant.parse(cfg)
    src = (moe_weights(HFWeights) if dc.moe else HFWeights)(index, dc, base_dir, quant=quant)
    module = build_decoder(dc, src, name=_module_name(folder))
    module.attrs.update(model_attributes(folder, cfg, dc, base_dir, require_tokenizer))
    if quant is not None:
        module.attrs["llm.quantization"] = quant.summary()
    if out_path is not None:
        module.source = str(os.path.abspath(out_path))
    return module


def _module_name(folder: Path) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in folder.resolve().name)
    return name if name and not name[0].isdigit() else "model_" + name


__all__ = [
    "import_hf",
    "decoder_config",
    "read_config",
    "ARCHITECTURES",
    "HFWeights",
    "emit_weight",
    "weight_file_attr",
]
