"""Model metadata checked against the weight files before anything is sized from it.

A decoder's sizes come from metadata (`config.json`, GGUF `*.block_count`, ...) that a user or a
damaged download can set to anything: `num_hidden_layers: 1e9` would make the importer build a
billion layers, `head_count: 0` divide by zero, `rms_norm_eps: -1` give an op that cannot verify.
Every size is checked here first, with one line naming the file and the field: counts are whole
numbers of the right sign, the layer count is at most the number of layers the weight files hold,
every width (hidden, heads, head_dim, intermediate, vocab) at most the largest tensor dimension in
the files, and floats are finite numbers in their range. The frontends call `check_hf_config`
and `check_gguf` before building their `DecoderConfig`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from llmir_core.errors import InputError

Fail = Callable[[str, str], InputError]  # (field, "message") -> the error to raise
MAX_CONTEXT = 1 << 26  # positions: 67M, above any published model's context


@dataclass(frozen=True)
class Backing:
    """What the weight files can back: the layers they hold and their largest tensor dimension."""

    layers: int
    max_dim: int
    files: str  # how to name the files in a message


def backing(shapes: Iterable[tuple[str, Iterable[int]]], layer_pattern: str, files: str) -> Backing:
    """Backing of tensors given as (name, shape); `layer_pattern` captures the layer index."""
    pat = re.compile(layer_pattern)
    layers: set[int] = set()
    max_dim = 0
    for name, shape in shapes:
        m = pat.match(name)
        if m:
            layers.add(int(m.group(1)))
        max_dim = max([max_dim, *(int(d) for d in shape)])
    return Backing(len(layers), max_dim, files)


def whole(fail: Fail, key: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """`value` as an int: a JSON/GGUF integer (or an integral float such as 1e3) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(key, f"must be a whole number, got {value!r:.60}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise fail(key, f"must be a whole number, got {value!r}")
    n = int(value)
    if n < low:
        raise fail(key, f"is {n}, must be at least {low}")
    if high is not None and n > high:
        raise fail(key, f"is {n}, more than {high}")
    return n


def number(
    fail: Fail,
    key: str,
    value: Any,
    low: float | None = None,
    *,
    above: bool = False,
    high: float | None = None,
) -> float:
    """`value` as a finite float, >= low (> low with `above`) and <= high."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(key, f"must be a number, got {value!r:.60}")
    x = float(value)
    if not math.isfinite(x):
        raise fail(key, f"must be a finite number, got {value!r}")
    if low is not None and (x <= low if above else x < low):
        raise fail(key, f"is {value!r}, must be {'greater than' if above else 'at least'} {low:g}")
    if high is not None and x > high:
        raise fail(key, f"is {value!r}, must be at most {high:g}")
    return x


def layer_count(fail: Fail, key: str, value: Any, b: Backing) -> int:
    n = whole(fail, key, value, 1)
    if n > b.layers:
        raise fail(key, f"is {n}, but the weights in {b.files} cover {b.layers} layer(s)")
    return n


def width(fail: Fail, key: str, value: Any, b: Backing) -> int:
    n = whole(fail, key, value, 1)
    if n > b.max_dim:
        raise fail(
            key, f"is {n}, larger than any tensor dimension in {b.files} (at most {b.max_dim})"
        )
    return n


def _present(get: Callable[[str], Any], key: str) -> bool:
    return get(key) is not None


# -- Hugging Face config.json -----------------------------------------------------------------------

_HF_WIDTHS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)


def check_hf_config(cfg: Any, tensors: Iterable[tuple[str, Iterable[int]]], files: str) -> None:
    """Check config.json's sizes and numbers (`cfg` is the importer's `_Cfg`) against the tensors
    of the checkpoint, given as (name, shape)."""
    for key in (
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "vocab_size",
        "intermediate_size",
    ):
        cfg.req(key)  # a missing field is named before any size is compared
    b = backing(tensors, r"model\.layers\.(\d+)\.", files)
    fail: Fail = cfg.fail
    layer_count(fail, "num_hidden_layers", cfg.req("num_hidden_layers"), b)
    for key in _HF_WIDTHS:
        if cfg.get(key) is not None:
            width(fail, key, cfg.get(key), b)
    whole(fail, "max_position_embeddings", cfg.get("max_position_embeddings"), 1, MAX_CONTEXT)
    number(fail, "rms_norm_eps", cfg.get("rms_norm_eps"), 0.0, high=1.0)
    for key in ("rope_theta", "query_pre_attn_scalar"):
        if cfg.get(key) is not None:
            number(fail, key, cfg.get(key), 0.0, above=True)
    if cfg.get("partial_rotary_factor") is not None:
        number(
            fail,
            "partial_rotary_factor",
            cfg.get("partial_rotary_factor"),
            0.0,
            above=True,
            high=1.0,
        )
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            number(fail, key, cfg.get(key), 0.0)
    for key in ("sliding_window", "max_window_layers"):
        if cfg.get(key) is not None:
            whole(fail, key, cfg.get(key), 0)
    for key in ("hidden_act", "hidden_activation"):
        if cfg.get(key) is not None and not isinstance(cfg.get(key), str):
            raise fail(key, f"must be a string, got {cfg.get(key)!r:.60}")
    for key in ("tie_word_embeddings", "attention_bias", "use_sliding_window", "mlp_bias"):
        if cfg.get(key) is not None and not isinstance(cfg.get(key), bool):
            raise fail(key, f"must be true or false, got {cfg.get(key)!r:.60}")
    types = cfg.data.get("layer_types")
    if types is not None and not (
        isinstance(types, list) and all(isinstance(t, str) for t in types)
    ):
        raise fail("layer_types", "must be a list of strings")
    for key in ("rope_parameters", "rope_scaling"):
        rp = cfg.data.get(key)
        if rp is not None and not isinstance(rp, dict):
            raise fail(key, f"must be an object, got {rp!r:.60}")
        if isinstance(rp, dict):
            _check_rope_dict(fail, key, rp)


def _check_rope_dict(fail: Fail, key: str, rp: dict[str, Any]) -> None:
    items = list(rp.items())
    if items and all(isinstance(v, dict) for _, v in items):  # per layer type
        for sub, v in items:
            _check_rope_dict(fail, f"{key}.{sub}", v)
        return
    for k in ("rope_type", "type"):
        if rp.get(k) is not None and not isinstance(rp[k], str):
            raise fail(f"{key}.{k}", f"must be a string, got {rp[k]!r:.60}")
    for k in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor"):
        if rp.get(k) is not None:
            number(fail, f"{key}.{k}", rp[k], 0.0, above=True)
    if rp.get("partial_rotary_factor") is not None:
        number(
            fail,
            f"{key}.partial_rotary_factor",
            rp["partial_rotary_factor"],
            0.0,
            above=True,
            high=1.0,
        )
    if rp.get("original_max_position_embeddings") is not None:
        whole(
            fail,
            f"{key}.original_max_position_embeddings",
            rp["original_max_position_embeddings"],
            1,
            MAX_CONTEXT,
        )


# -- GGUF -----------------------------------------------------------------------------------------

_GGUF_REQUIRED = (
    "embedding_length",
    "attention.head_count",
    "block_count",
    "context_length",
    "feed_forward_length",
    "attention.layer_norm_rms_epsilon",
)
_GGUF_TOKEN_ARRAYS = {
    "tokens": "string",
    "merges": "string",
    "scores": "number",
    "token_type": "number",
}


def check_gguf(g: Any) -> None:
    """Check a GGUF file's tensor alignment, the architecture's sizes and numbers, and the types
    of its tokenizer arrays (`g` is the importer's `GGUFFile`)."""
    reader = g.reader
    align = int(getattr(reader, "alignment", 32) or 32)
    base = int(getattr(reader, "data_offset", 0))
    for t in reader.tensors:
        if (int(t.data_offset) - base) % align:
            raise InputError(
                f"{g.path}: tensor '{t.name}' starts at byte {int(t.data_offset)}, not on "
                f"the file's {align}-byte alignment (general.alignment)",
                hint="the file is damaged or was written by a broken converter",
            )
    from .gguf import ARCHITECTURES

    arch = g.get("general.architecture")
    if arch not in ARCHITECTURES:
        return  # the importer names a missing or unsupported architecture itself
    a = arch + "."
    for key in _GGUF_REQUIRED:  # a missing field is named before any size is compared
        g.req(a + key)
    shards = len(getattr(g, "shards", [g.path]))
    b = backing(  # a split model: the tensors of every shard
        ((t.name, [int(d) for d in t.shape]) for t in g.tensors.values()),
        r"blk\.(\d+)\.",
        f"the {shards} shards" if shards > 1 else "the file",
    )
    fail: Fail = g.fail
    layer_count(fail, a + "block_count", g.req(a + "block_count"), b)
    for key in ("embedding_length", "attention.head_count", "feed_forward_length"):
        width(fail, a + key, g.req(a + key), b)
    for key in (
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "vocab_size",
        "rope.dimension_count",
    ):
        if _present(g.get, a + key):
            width(fail, a + key, g.get(a + key), b)
    whole(fail, a + "context_length", g.req(a + "context_length"), 1, MAX_CONTEXT)
    number(
        fail,
        a + "attention.layer_norm_rms_epsilon",
        g.req(a + "attention.layer_norm_rms_epsilon"),
        0.0,
        high=1.0,
    )
    for key in ("rope.freq_base", "rope.scaling.factor", "attention.scale"):
        if _present(g.get, a + key):
            number(fail, a + key, g.get(a + key), 0.0, above=True)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if _present(g.get, a + key):
            number(fail, a + key, g.get(a + key), 0.0)
    if _present(g.get, a + "attention.sliding_window"):
        whole(fail, a + "attention.sliding_window", g.get(a + "attention.sliding_window"), 0)
    _check_gguf_tokenizer(g)


def _check_gguf_tokenizer(g: Any) -> None:
    fields = g.reader.fields
    for key, kind in _GGUF_TOKEN_ARRAYS.items():
        f = fields.get("tokenizer.ggml." + key)
        if f is None:
            continue
        types = [int(t) for t in f.types]
        is_array = types[:1] == [9]
        elem_string = is_array and types[-1] == 8
        if not is_array or (kind == "string") != elem_string:
            want = "an array of strings" if kind == "string" else "an array of numbers"
            raise g.fail(
                "tokenizer.ggml." + key,
                f"must be {want}",
                hint="the file's tokenizer is damaged: convert the model again",
            )
    n = len(g.get("tokenizer.ggml.tokens") or [])
    for key in (
        "bos_token_id",
        "eos_token_id",
        "eot_token_id",
        "unknown_token_id",
        "padding_token_id",
    ):
        v = g.get("tokenizer.ggml." + key)
        if v is not None:
            whole(g.fail, "tokenizer.ggml." + key, v, 0, n - 1 if n else None)
