"""Import a GGUF file (as llama.cpp's converter writes it) as an llmir decoder.

A split model (`NAME-00001-of-0000N.gguf`, `split.count` > 1) is read from its first shard;
every shard is opened and each weight references its own shard (see `gguf_split`).

The only module that imports the `gguf` package. `GGUFReader` memory-maps the file; metadata
becomes a `DecoderConfig`, and every tensor a `core.weight` referencing the file by absolute byte
offset: F32 as is, F16/BF16 followed by `core.cast`, block-quantized formats (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q2_K..Q6_K) kept packed as `!quant.*` tensors followed by `llm.dequantize` — nothing
is dequantized or read at import. Architectures: llama (mistral is written as llama), qwen2,
qwen3, phi3, gemma2, gemma3, and the mixture-of-experts qwen2moe, qwen3moe (and llama with experts).

llama.cpp's converter permutes the rows of llama's Q and K projections so that its rotary
embedding can rotate adjacent pairs (2i, 2i+1) instead of halves (i, i + d/2); the importer keeps
the permuted weights and uses `interleaved = true` rotary for llama, which gives the same
attention scores (q and k are permuted alike, so q.k is unchanged). The other architectures use
the NeoX layout (no permutation, halves).
"""

from __future__ import annotations

import functools
import math
import os
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

from llmir_core.builder import Builder
from llmir_core.errors import InputError
from llmir_core.ir.core import Module, Value
from llmir_core.ir.types import GGUF_QUANTS, DType, QuantType, TensorType

from .hf import weight_file_attr
from .llm_graph import DecoderConfig, MoeSpec, RopeSpec, build_decoder, inv_freq_default
from .validate_config import check_gguf

ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen2moe", "qwen3moe")

_PLAIN = {"F32": DType.f32, "F16": DType.f16, "BF16": DType.bf16, "F64": DType.f64}
_REDOWNLOAD = "the file is damaged or incomplete: download or convert it again"
_ARRAY, _STRING = 9, 8  # GGUFValueType.ARRAY, GGUFValueType.STRING


_READ_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    OverflowError,
    UnicodeDecodeError,
    TypeError,
    struct.error,
)


def _open_reader(path: str) -> Any:
    """A checked `GGUFReader` of `path` (see `_reader_class`); every failure is one InputError."""
    size = _check_magic(path)
    try:
        return _reader_class()(path)
    except InputError:
        raise
    except _READ_ERRORS as exc:
        # the reader's own messages say what is wrong; numpy's (a view past the end) do not
        said = str(exc)
        known = any(
            k in said for k in ("version", "Duplicate", "alignment", "field type", "past the end")
        )
        why = said if known else "the header is truncated or damaged"
        raise InputError(
            f"{path}: not a readable GGUF file ({size} bytes): {why}", hint=_REDOWNLOAD
        ) from None


def _check_magic(path: str) -> int:
    """The size of `path`, once it is known to be a readable file that starts like a GGUF."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if size == 0:
        raise InputError(f"{path}: empty file, not a GGUF model", hint=_REDOWNLOAD)
    if magic != b"GGUF":
        raise InputError(
            f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')",
            hint="pass a .gguf model file",
        )
    return size


@functools.cache
def _reader_class() -> Any:
    """GGUFReader with two changes, for multi-GB files with 100k-token vocabularies:

    - an array of numbers is one numpy view, and an array of strings one byte view plus
      offsets (stock GGUFReader makes a numpy view per element: 40 s and 650 MB for a
      Llama 3 vocabulary); `strings(field)` decodes one when it is needed;
    - each tensor's type and byte range are checked before it is viewed.
    """
    import gguf

    class _Reader(gguf.GGUFReader):  # type: ignore[misc]
        def __init__(self, p: str) -> None:
            self.path = p
            self.string_arrays: dict[int, tuple[list[int], list[int]]] = {}
            super().__init__(p)

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            parts = _array_field_parts(self, orig_offs, raw_type)
            return super()._get_field_parts(orig_offs, raw_type) if parts is None else parts

        def strings(self, field: Any) -> list[str]:
            key = field.offset + 8 + len(field.name.encode("utf-8")) + 4
            starts, lens = self.string_arrays[key]
            raw = bytes(self.data[starts[0] : starts[-1] + lens[-1]]) if starts else b""
            base = starts[0] if starts else 0
            return [
                raw[s - base : s - base + n].decode("utf-8", "replace")
                for s, n in zip(starts, lens)
            ]

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            _check_tensor_ranges(self.path, len(self.data), start_offs, fields)
            super()._build_tensors(start_offs, fields)

    return _Reader


def _array_field_parts(reader: Any, orig_offs: int, raw_type: int) -> Any:
    """The parts of a metadata array field as one view (numbers) or one byte view with its
    string offsets recorded in `reader.string_arrays`; None for the stock reader's way."""
    import gguf

    vt = gguf.GGUFValueType
    if raw_type != vt.ARRAY:
        return None
    raw_itype = reader._get(orig_offs, np.uint32)
    alen = reader._get(orig_offs + 4, np.uint64)
    if len(raw_itype) != 1 or len(alen) != 1:
        raise ValueError(f"metadata array at byte {orig_offs} runs past the end of the file")
    n, itype = int(alen[0]), vt(int(raw_itype[0]))
    offs = orig_offs + 12
    nptype = reader.gguf_scalar_to_np.get(itype)
    if nptype is not None:
        vals = reader._get(offs, nptype, n)
        if len(vals) != n:
            raise ValueError(f"metadata array at byte {orig_offs} runs past the end of the file")
        return 12 + int(vals.nbytes), [raw_itype, alen, vals], [2], [vt.ARRAY, itype]
    if itype != vt.STRING:
        return None
    starts, lens, end = _walk_strings(reader.data, reader.byte_order, offs, n)
    reader.string_arrays[orig_offs] = (starts, lens)
    blob = reader.data[offs:end]
    return end - orig_offs, [raw_itype, alen, blob], [2], [vt.ARRAY, vt.STRING]


def _walk_strings(
    data: Any, byte_order: str, offs: int, n: int
) -> tuple[list[int], list[int], int]:
    """The starts and lengths of `n` length-prefixed strings from byte `offs`, and their end."""
    buf, size = memoryview(data), len(data)
    fmt = ">Q" if byte_order == "S" and sys.byteorder == "little" else "<Q"
    unpack = struct.Struct(fmt).unpack_from
    starts, lens = [], []
    for _ in range(n):
        if offs + 8 > size:
            raise ValueError("a metadata string array runs past the end of the file")
        (length,) = unpack(buf, offs)
        offs += 8
        starts.append(offs)
        lens.append(length)
        offs += length
    if offs > size:
        raise ValueError("a metadata string array runs past the end of the file")
    return starts, lens, offs


def _check_tensor_ranges(path: str, size: int, start_offs: int, fields: list[Any]) -> None:
    """Each tensor's type is known and its bytes lie inside the file (`size` bytes)."""
    import gguf

    for f in fields:
        _nl, name_data, _nd, dims, raw_dtype, offset = f.parts
        name = bytes(name_data).decode("utf-8", "replace")
        raw = int(raw_dtype[0])
        try:
            qt = gguf.GGMLQuantizationType(raw)
        except ValueError:
            raise InputError(
                f"{path}: tensor '{name}' has unknown tensor type {raw}",
                hint="the file was written by a newer llama.cpp, or is damaged",
            ) from None
        block, type_size = gguf.GGML_QUANT_SIZES[qt]
        n = int(np.prod(dims.astype(np.int64))) if len(dims) else 1
        begin = int(start_offs + offset[0])
        end = begin + n * type_size // block
        if end > size:
            raise InputError(
                f"{path}: truncated GGUF file: tensor '{name}' needs bytes "
                f"{begin}..{end}, the file has {size}",
                hint=_REDOWNLOAD,
            )


class GGUFFile:
    """Metadata and tensors of one GGUF file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(Path(path).resolve())
        self.reader = _open_reader(self.path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.tensor_paths: dict[str, str] = {}  # tensors of other shards -> their file
        self.shards = [self.path]
        count = self.get_typed("split.count", int)
        if count is not None and count > 1:
            self._open_shards(count)

    def _open_shards(self, count: int) -> None:
        """Tensors of every shard of a split model (their data stays in their own file)."""
        from .gguf_split import SPLIT_TENSORS, check_shard, shard_paths

        self.shards = shard_paths(self.path, self.get_typed("split.no", int) or 0, count)
        for no, p in enumerate(self.shards[1:], 1):
            reader = _open_reader(p)
            fields = reader.fields
            got = [
                fields[k].contents() if k in fields else None for k in ("split.no", "split.count")
            ]
            check_shard(p, no, count, *got)
            for t in reader.tensors:
                if t.name in self.tensors:
                    raise InputError(
                        f"{p}: tensor '{t.name}' is also in another shard", hint=_REDOWNLOAD
                    )
                self.tensors[t.name] = t
                self.tensor_paths[t.name] = p
        want = self.get_typed(SPLIT_TENSORS, int)
        if want is not None and want != len(self.tensors):
            raise InputError(
                f"{self.path}: metadata field '{SPLIT_TENSORS}' is {want}, the "
                f"{count} shards hold {len(self.tensors)} tensors",
                hint=_REDOWNLOAD,
            )

    def tensor_path(self, name: str) -> str:
        """The file (shard) that holds tensor `name`."""
        return self.tensor_paths.get(name, self.path)

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        f = self.reader.fields.get(key)
        if f is None:
            return default
        try:
            if f.types[:1] == [_ARRAY] and f.types[-1] == _STRING and len(f.data) == 1:
                return self.reader.strings(f)
            v = f.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise InputError(
                f"{self.path}: metadata field '{key}' cannot be read ({exc})", hint=_REDOWNLOAD
            ) from None
        return v.item() if isinstance(v, np.generic) else v

    def get_typed(self, key: str, kind: type) -> Any:
        """`get`, where a value of another type (a crafted file) is an error naming the field;
        an int field takes no bool."""
        v = self.get(key)
        if v is None or (isinstance(v, kind) and not (kind is int and isinstance(v, bool))):
            return v
        what = {int: "a whole number", str: "a string", list: "an array"}.get(kind, kind.__name__)
        raise self.fail(key, f"must be {what}, got {type(v).__name__} {v!r:.40}")

    def req(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise InputError(
                f"{self.path}: metadata field '{key}' is missing",
                hint="the file was not written by llama.cpp's converter for this architecture",
            )
        return v

    def fail(self, key: str, message: str, hint: str | None = None) -> InputError:
        return InputError(f"{self.path}: metadata field '{key}' {message}", hint=hint)

    def tensor_values(self, name: str) -> np.ndarray:
        """A small float tensor's values (rope frequency factors), read at import."""
        t = self.tensors[name]
        if t.tensor_type.name not in ("F32", "F16"):
            raise InputError(f"{self.path}: tensor '{name}' must be F32, is {t.tensor_type.name}")
        return np.asarray(t.data, dtype=np.float32).reshape(-1)


# -- metadata -> DecoderConfig --------------------------------------------------------------------


def decoder_config(g: GGUFFile) -> DecoderConfig:
    arch = g.req("general.architecture")
    if arch not in ARCHITECTURES:
        raise g.fail(
            "general.architecture",
            f"is '{arch}', which is not supported",
            hint=f"supported: {', '.join(ARCHITECTURES)}",
        )
    a = arch + "."
    hidden = int(g.req(a + "embedding_length"))
    heads = int(g.req(a + "attention.head_count"))
    kv_heads = int(g.get(a + "attention.head_count_kv") or heads)
    layers = int(g.req(a + "block_count"))
    head_dim = int(g.get(a + "attention.key_length") or hidden // heads)
    if int(g.get(a + "attention.value_length") or head_dim) != head_dim:
        raise g.fail(
            a + "attention.value_length", "differs from key_length, which is not supported"
        )
    if heads % kv_heads:
        raise g.fail(
            a + "attention.head_count_kv", f"({kv_heads}) does not divide head_count ({heads})"
        )
    embd = g.tensors.get("token_embd.weight")
    vocab = g.get(a + "vocab_size")
    if vocab is None and embd is not None:
        vocab = int(embd.shape[-1])
    if vocab is None:
        vocab = len(g.req("tokenizer.ggml.tokens"))
    context = int(g.req(a + "context_length"))
    dc = DecoderConfig(
        arch=arch,
        vocab=int(vocab),
        hidden=hidden,
        intermediate=int(g.req(a + "feed_forward_length")),
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        eps=float(g.req(a + "attention.layer_norm_rms_epsilon")),
        context=context,
        rope=[_rope(g, arch, head_dim)] * layers,
        tie_embeddings="output.weight" not in g.tensors,
    )
    window = int(g.get(a + "attention.sliding_window") or 0)
    if arch == "phi3":
        dc.sliding_window = [window] * layers
    if arch in ("qwen2", "llama", "qwen3", "qwen2moe", "qwen3moe"):
        dc.qkv_bias = "blk.0.attn_q.bias" in g.tensors
        dc.o_bias = "blk.0.attn_output.bias" in g.tensors
    if arch in ("qwen3", "qwen3moe"):
        dc.qk_norm = True
    dc.moe = moe_layers(g, arch, layers, dc.intermediate)
    if arch == "gemma3":
        gemma3_layers(g, dc)
    if arch == "gemma2":
        dc.activation = "gelu_tanh"
        dc.sandwich_norms = True  # the converter already added 1 to the norm weights
        dc.embed_scale = float(np.float32(math.sqrt(hidden)))
        scale = g.get(a + "attention.scale")
        if scale is None:  # llama.cpp's rule: 27B scales by hidden / heads, the others by head_dim
            scale = 1.0 / math.sqrt(hidden / heads if layers == 46 else head_dim)
        dc.attn_scale = float(scale)
        dc.attn_softcap = float(g.get(a + "attn_logit_softcapping") or 0.0)
        dc.final_softcap = float(g.get(a + "final_logit_softcapping") or 0.0)
        dc.sliding_window = [window if i % 2 == 0 else 0 for i in range(layers)]
    return dc


def gemma3_layers(g: GGUFFile, dc: DecoderConfig) -> None:
    """Gemma 3 as llama.cpp reads it: gemma2's norms and scales without soft-capping by default,
    q/k norms, local (sliding) layers by `attention.sliding_window_pattern` (default: every 6th
    layer global) with their own rope base (`rope.freq_base_swa`, default 10000, unscaled)."""
    a = "gemma3."
    layers = dc.layers
    dc.activation = "gelu_tanh"
    dc.sandwich_norms = dc.qk_norm = True  # the converter already added 1 to every norm weight
    dc.embed_scale = float(np.float32(math.sqrt(dc.hidden)))
    scale = g.get(a + "attention.scale")
    if (
        scale is None
    ):  # llama.cpp's rule: 27B (62 layers) scales by hidden / heads, the others by head_dim
        scale = 1.0 / math.sqrt(dc.hidden / dc.heads if layers == 62 else dc.head_dim)
    dc.attn_scale = float(scale)
    dc.attn_softcap = float(g.get(a + "attn_logit_softcapping") or 0.0)
    dc.final_softcap = float(g.get(a + "final_logit_softcapping") or 0.0)
    pattern = g.get(a + "attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, int):
        n = int(pattern or 6)
        local = [(i % n) < n - 1 for i in range(layers)]
    else:
        local = [bool(x) for x in pattern]
        if len(local) != layers:
            raise g.fail(
                a + "attention.sliding_window_pattern",
                f"has {len(local)} entries for {layers} layers",
            )
    window = int(g.req(a + "attention.sliding_window"))
    dc.sliding_window = [window if x else 0 for x in local]
    rdim = int(g.get(a + "rope.dimension_count") or dc.head_dim)
    swa = RopeSpec(
        tuple(
            float(f)
            for f in inv_freq_default(float(g.get(a + "rope.freq_base_swa") or 10000.0), rdim)
        ),
        rdim,
    )
    dc.rope = [swa if x else dc.rope[i] for i, x in enumerate(local)]


# llama.cpp's expert-weight renormalisation per architecture (the expert_weights_norm key wins)
_MOE_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True}


def moe_layers(g: GGUFFile, arch: str, layers: int, intermediate: int) -> list[MoeSpec | None]:
    """Mixture-of-experts layers (llama.cpp's stacked ffn_*_exps tensors); [] for a dense model."""
    a = arch + "."
    experts = int(g.get(a + "expert_count") or 0)
    if experts == 0:
        return []
    if arch not in _MOE_NORM:
        raise g.fail(
            a + "expert_count", f"is {experts}: mixture of experts is not supported for {arch}"
        )
    top_k = int(g.req(a + "expert_used_count"))
    if not 1 <= top_k <= experts:
        raise g.fail(
            a + "expert_used_count", f"({top_k}) must be between 1 and expert_count ({experts})"
        )
    norm = g.get(a + "expert_weights_norm")
    shared = (
        int(g.get(a + "expert_shared_feed_forward_length") or 0)
        if "blk.0.ffn_gate_shexp.weight" in g.tensors
        else 0
    )
    spec = MoeSpec(
        experts,
        top_k,
        int(g.get(a + "expert_feed_forward_length") or intermediate),
        norm_topk=bool(_MOE_NORM[arch] if norm is None else norm),
        shared_inter=shared,
        shared_gate=shared > 0 and "blk.0.ffn_gate_inp_shexp.weight" in g.tensors,
    )
    return [spec if f"blk.{i}.ffn_gate_inp.weight" in g.tensors else None for i in range(layers)]


def _rope(g: GGUFFile, arch: str, head_dim: int) -> RopeSpec:
    a = arch + "."
    rdim = int(g.get(a + "rope.dimension_count") or head_dim)
    inv = inv_freq_default(float(g.get(a + "rope.freq_base") or 10000.0), rdim)
    stype = g.get(a + "rope.scaling.type") or "none"
    factor = float(g.get(a + "rope.scaling.factor") or 1.0)
    scaled = _yarn_or_longrope(g, arch, str(stype), rdim)
    if scaled is not None:
        return scaled
    if stype == "linear" and factor != 1.0:
        inv = (inv / np.float32(factor)).astype(np.float32)
    elif stype not in ("none", "linear"):
        raise g.fail(
            a + "rope.scaling.type",
            f"is '{stype}', which is not supported",
            hint="supported: none, linear, and llama3 (rope_freqs tensor)",
        )
    if "rope_freqs.weight" in g.tensors:  # llama 3.1: per-frequency divisors
        factors = g.tensor_values("rope_freqs.weight")
        if factors.shape != inv.shape:
            raise InputError(
                f"{g.path}: tensor 'rope_freqs.weight' has {factors.size} values, "
                f"expected {inv.size}"
            )
        inv = (inv / factors).astype(np.float32)
    return RopeSpec(tuple(float(f) for f in inv), rdim, interleaved=(arch == "llama"))


def _yarn_or_longrope(g: GGUFFile, arch: str, stype: str, rdim: int) -> RopeSpec | None:
    """YaRN (`rope.scaling.type = yarn`) and Phi-3 longrope (`rope_factors_long/short` tensors),
    through the same frequency rules as the Hugging Face importer (`rope`); None for the others."""
    from .rope import RopeParams, rope_spec_from

    a = arch + "."
    long_t, short_t = "rope_factors_long.weight", "rope_factors_short.weight"
    if stype != "yarn" and not (long_t in g.tensors or short_t in g.tensors):
        return None
    context = int(g.req(a + "context_length"))
    params: dict[str, Any] = {"rope_theta": float(g.get(a + "rope.freq_base") or 10000.0)}
    original = g.get(a + "rope.scaling.original_context_length")
    if original is not None:
        params["original_max_position_embeddings"] = int(original)
    attn = g.get(a + "rope.scaling.attn_factor")
    if attn is not None:
        params["attention_factor"] = float(attn)
    if stype == "yarn":
        params["factor"] = float(g.req(a + "rope.scaling.factor"))
        for key, name in (
            ("rope.scaling.yarn_beta_fast", "beta_fast"),
            ("rope.scaling.yarn_beta_slow", "beta_slow"),
        ):
            v = g.get(a + key)
            if v is not None:
                params[name] = float(v)
        ext = g.get(a + "rope.scaling.yarn_ext_factor")
        if ext is not None and float(ext) not in (
            -1.0,
            1.0,
        ):  # -1: llama.cpp's "default" (1 for yarn)
            raise g.fail(
                a + "rope.scaling.yarn_ext_factor",
                f"is {float(ext)}: only 1 (full YaRN) is supported",
            )
        kind = "yarn"
    else:
        if long_t not in g.tensors or short_t not in g.tensors:
            raise InputError(
                f"{g.path}: longrope needs both tensors '{long_t}' and '{short_t}'",
                hint=_REDOWNLOAD,
            )
        params["long_factor"] = [float(x) for x in g.tensor_values(long_t)]
        params["short_factor"] = [float(x) for x in g.tensor_values(short_t)]
        kind = "longrope"
    rp = RopeParams(params, "rope", g.path, rdim, context)
    spec = rope_spec_from(kind, rp)
    return RopeSpec(
        spec.inv_freq,
        spec.rotary_dim,
        interleaved=(arch == "llama"),
        scaling=spec.scaling,
        inv_freq_long=spec.inv_freq_long,
        long_from=spec.long_from,
    )


# -- weights ----------------------------------------------------------------------------------

_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_MOE = {
    "moe.router": "ffn_gate_inp",
    "moe.w_gate": "ffn_gate_exps",
    "moe.w_up": "ffn_up_exps",
    "moe.w_down": "ffn_down_exps",
    "moe.shared_gate": "ffn_gate_shexp",
    "moe.shared_up": "ffn_up_shexp",
    "moe.shared_down": "ffn_down_shexp",
    "moe.shared_router": "ffn_gate_inp_shexp",
}
_GEMMA2 = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# phi3 fuses projections: key -> (gguf tensor, part); parts are row blocks
_PHI3_FUSED = {
    "self_attn.q_proj": ("attn_qkv", 0),
    "self_attn.k_proj": ("attn_qkv", 1),
    "self_attn.v_proj": ("attn_qkv", 2),
    "mlp.gate_proj": ("ffn_up", 0),
    "mlp.up_proj": ("ffn_up", 1),
}


def elem_type(g: GGUFFile, t: Any) -> DType | QuantType:
    name = t.tensor_type.name
    if name in _PLAIN:
        return _PLAIN[name]
    q = GGUF_QUANTS.get(name.lower())
    if q is None:
        supported = ", ".join(list(_PLAIN) + [k.upper() for k in GGUF_QUANTS])
        raise InputError(
            f"{g.path}: tensor '{t.name}' has type {name}, which llmir does not support",
            hint=f"supported tensor types: {supported}; requantize with llama-quantize",
        )
    return q


class GGUFWeights:
    """Weight references into the GGUF file by absolute offset; dequantized only in the graph."""

    def __init__(self, g: GGUFFile, dc: DecoderConfig, base_dir: str | None) -> None:
        self.g, self.dc, self.base_dir = g, dc, base_dir
        self._cache: dict[tuple[str, int | None], Value] = {}

    def _fused(self, key: str, layer: int | None) -> tuple[str, int] | None:
        if self.dc.arch != "phi3" or key not in _PHI3_FUSED or layer is None:
            return None
        fused, part = _PHI3_FUSED[key]
        if fused == "ffn_up" and f"blk.{layer}.ffn_gate.weight" in self.g.tensors:
            return None  # written unfused
        if fused == "attn_qkv" and f"blk.{layer}.attn_qkv.weight" not in self.g.tensors:
            return None
        return fused, part

    def tensor_name(self, key: str, layer: int | None) -> str:
        bias = key.endswith(".bias")
        base = key.removesuffix(".bias")
        suffix = ".bias" if bias else ".weight"
        if layer is None:
            return _TOP[base] + suffix
        fused = self._fused(base, layer)
        if fused:
            return f"blk.{layer}.{fused[0]}{suffix}"
        table = (
            {**_LAYER, **_GEMMA2} if self.dc.arch in ("gemma2", "gemma3") else {**_LAYER, **_MOE}
        )
        return f"blk.{layer}.{table[base]}{suffix}"

    def has(self, key: str, layer: int | None = None) -> bool:
        return self.tensor_name(key, layer) in self.g.tensors

    def origin(self, key: str, layer: int | None = None) -> str:
        if key == "model.rotary_emb":
            return "gguf:rope"
        if key in ("self_attn", "mlp"):
            return f"gguf:blk.{layer}.{'attn' if key == 'self_attn' else 'ffn'}"
        return "gguf:" + self.tensor_name(key, layer).removesuffix(".weight")

    def _expected(self, key: str, layer: int | None = None) -> tuple[int, ...]:
        dc = self.dc
        spec = dc.moe[layer] if dc.moe and layer is not None else None
        if spec is not None and key.startswith("moe."):
            e, h, i, si = spec.experts, dc.hidden, spec.inter, spec.shared_inter
            return {
                "moe.router": (e, h),
                "moe.w_gate": (e, i, h),
                "moe.w_up": (e, i, h),
                "moe.w_down": (e, h, i),
                "moe.shared_gate": (si, h),
                "moe.shared_up": (si, h),
                "moe.shared_down": (h, si),
                "moe.shared_router": (1, h),
            }[key]
        q, kv = dc.heads * dc.head_dim, dc.kv_heads * dc.head_dim
        base = key.removesuffix(".bias")
        if key.endswith(".bias"):
            return ({"self_attn.o_proj": dc.hidden, "self_attn.q_proj": q}.get(base, kv),)
        table = {
            "model.embed_tokens": (dc.vocab, dc.hidden),
            "lm_head": (dc.vocab, dc.hidden),
            "self_attn.q_proj": (q, dc.hidden),
            "self_attn.k_proj": (kv, dc.hidden),
            "self_attn.v_proj": (kv, dc.hidden),
            "self_attn.o_proj": (dc.hidden, q),
            "self_attn.q_norm": (dc.head_dim,),
            "self_attn.k_norm": (dc.head_dim,),
            "mlp.gate_proj": (dc.intermediate, dc.hidden),
            "mlp.up_proj": (dc.intermediate, dc.hidden),
            "mlp.down_proj": (dc.hidden, dc.intermediate),
        }
        return table.get(base, (dc.hidden,))

    def weight(self, b: Builder, key: str, layer: int | None = None) -> Value:
        ck = (key, layer)
        if ck in self._cache:
            return self._cache[ck]
        name = self.tensor_name(key, layer)
        t = self.g.tensors.get(name)
        if t is None:
            raise InputError(
                f"{self.g.path}: tensor '{name}' is missing",
                hint="the file does not match its metadata (architecture or layer count)",
            )
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        offset, nbytes = int(t.data_offset), int(t.n_bytes)
        fused = self._fused(key.removesuffix(".bias"), layer)
        if fused:
            dc = self.dc
            sizes = (
                [dc.heads * dc.head_dim, dc.kv_heads * dc.head_dim, dc.kv_heads * dc.head_dim]
                if fused[0] == "attn_qkv"
                else [dc.intermediate, dc.intermediate]
            )
            if shape[0] != sum(sizes):
                raise InputError(
                    f"{self.g.path}: tensor '{name}' has {shape[0]} rows, expected {sum(sizes)}"
                )
            row_bytes = nbytes // shape[0]
            part = fused[1]
            offset += sum(sizes[:part]) * row_bytes
            name = (
                f"{name}[{sum(sizes[:part])}:{sum(sizes[: part + 1])}]"  # a row block: its own name
            )
            shape = (sizes[part],) + shape[1:]
            nbytes = sizes[part] * row_bytes
        want = self._expected(key, layer)
        if key == "moe.shared_router" and shape == want[1:]:
            shape = want  # llama.cpp stores it as {n_embd}: the same bytes as [1, n_embd]
        if shape != want:
            raise InputError(
                f"{self.g.path}: tensor '{name}' has shape {list(shape)}, but the "
                f"metadata implies {list(want)}",
                hint=_REDOWNLOAD,
            )
        et = elem_type(self.g, t)
        attrs = {
            "file": weight_file_attr(self.g.tensor_path(t.name), self.base_dir),
            "name": name,
            "offset": offset,
            "nbytes": nbytes,
        }
        v = b.create(
            "core.weight", [], attrs, result_types=[TensorType(shape, et)], names=[name]
        ).results[0]
        if isinstance(et, QuantType):
            v = b.op("llm.dequantize", v, dtype=DType.f32, name_hint=name + ".f32")
        elif et != DType.f32:
            v = b.op("core.cast", v, to=DType.f32, name_hint=name + ".f32")
        self._cache[ck] = v
        return v


# -- tokenizer metadata ---------------------------------------------------------------------------

_TOKENIZER_KEYS = (
    "model",
    "pre",
    "tokens",
    "scores",
    "token_type",
    "merges",
    "bos_token_id",
    "eos_token_id",
    "unknown_token_id",
    "padding_token_id",
    "eot_token_id",
    "eom_token_id",
    "seperator_token_id",
    "add_bos_token",
    "add_eos_token",
    "add_sep_token",
    "add_space_prefix",
    "remove_extra_whitespaces",
    "precompiled_charsmap",
    "lowercase",
    "strip_accents",
)


def read_tokenizer(path: str | os.PathLike[str], g: GGUFFile | None = None) -> dict[str, Any]:
    """The `tokenizer.ggml.*` fields (and the chat template) as plain Python values."""
    g = g or GGUFFile(path)
    out: dict[str, Any] = {"path": g.path}
    for k in _TOKENIZER_KEYS:
        v = g.get("tokenizer.ggml." + k)
        if v is not None:
            out[k] = v
    template = g.get("tokenizer.chat_template")
    if template is not None:
        out["chat_template"] = template
    return out


def _check_tokenizer(g: GGUFFile) -> None:
    from llmir_core.runtime.tokenizer import TOKENIZER_MODELS

    model = g.get("tokenizer.ggml.model")
    if model is None:
        raise g.fail(
            "tokenizer.ggml.model",
            "is missing: the file holds no tokenizer",
            hint="convert the model again with its tokenizer, or import with --no-tokenizer",
        )
    if model not in TOKENIZER_MODELS:
        raise g.fail(
            "tokenizer.ggml.model",
            f"is '{model}', which is not supported",
            hint=f"supported tokenizer models: {', '.join(TOKENIZER_MODELS)}",
        )
    if not g.has("tokenizer.ggml.tokens"):
        raise g.fail("tokenizer.ggml.tokens", "is missing: the file holds no vocabulary")
    from llmir_core.runtime.pretokenize import SUPPORTED_PRE, pre_tokenizer

    pre = g.get("tokenizer.ggml.pre") or "default"
    if model == "gpt2" and pre_tokenizer(pre) is None:
        raise g.fail(
            "tokenizer.ggml.pre",
            f"is '{pre}', a pre-tokenizer llmir does not know",
            hint=f"supported: {', '.join(SUPPORTED_PRE)}; or import with --no-tokenizer",
        )


def special_ids(g: GGUFFile) -> tuple[tuple[int, ...], int | None]:
    """End-of-generation ids and the BOS id, by llama.cpp's rules (its defaults for absent keys)."""
    if not g.has("tokenizer.ggml.tokens"):
        eos = [g.get_typed(f"tokenizer.ggml.{k}_token_id", int) for k in ("eos", "eot")]
        bos = g.get_typed("tokenizer.ggml.bos_token_id", int)
        return tuple(dict.fromkeys(int(e) for e in eos if e is not None)), (
            int(bos) if bos is not None else None
        )
    from llmir_core.runtime.pretokenize import special_tokens

    keys = (
        "model",
        "pre",
        "tokens",
        "bos_token_id",
        "eos_token_id",
        "eot_token_id",
        "eom_token_id",
        "seperator_token_id",
        "add_bos_token",
        "add_eos_token",
        "add_sep_token",
    )
    kinds = {"model": str, "pre": str, "tokens": list}  # *_id: int; add_*: GGUF bool
    meta = {  # not the merges: a 128k vocabulary has 280k
        k: g.get_typed("tokenizer.ggml." + k, kinds.get(k, bool if k.startswith("add_") else int))
        for k in keys
    }
    st = special_tokens({k: v for k, v in meta.items() if v is not None})
    return st.eog_ids, st.bos_id


def model_attributes(
    g: GGUFFile, dc: DecoderConfig, base_dir: str | None, require_tokenizer: bool
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "llm.architecture": dc.arch,
        "llm.source": "gguf",
        "llm.context_length": dc.context,
        "llm.vocab_size": dc.vocab,
        "llm.num_layers": dc.layers,
    }
    attrs["llm.eos_token_ids"], attrs["llm.bos_token_id"] = special_ids(g)
    if not require_tokenizer:  # --no-tokenizer: the module (and its build) take token ids only
        return attrs
    _check_tokenizer(g)
    attrs["llm.tokenizer"] = {"format": "gguf", "file": weight_file_attr(g.path, base_dir)}
    template = g.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        attrs["llm.chat_template"] = template
    return attrs


def import_gguf(
    path: str | os.PathLike[str],
    out_path: str | os.PathLike[str] | None = None,
    require_tokenizer: bool = True,
) -> Module:
    """Import the GGUF file at `path`; weight paths are relative to `out_path`'s folder if given."""
    g = GGUFFile(path)
    check_gguf(g)
    dc = decoder_config(g)
    base_dir = os.path.dirname(os.path.abspath(out_path)) if out_path is not None else None
    src = GGUFWeights(g, dc, base_dir)
    attrs = model_attributes(g, dc, base_dir, require_tokenizer)
    module = build_decoder(dc, src, name=_module_name(g))
    module.attrs.update(attrs)
    if out_path is not None:
        module.source = str(os.path.abspath(out_path))
    return module


def _module_name(g: GGUFFile) -> str:
    raw = g.get("general.name") or Path(g.path).stem
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in str(raw))
    return name if name and not name[0].isdigit() else "model_" + name


__all__ = ["import_gguf", "GGUFFile", "read_tokenizer", "decoder_config", "ARCHITECTURES"]
