"""Mixture-of-experts architectures in Hugging Face folders: Mixtral, Qwen2-MoE, Qwen3-MoE and
DeepSeek-V2 (its attention and routing in `hf_deepseek`).

Each is its dense base architecture (mistral, qwen2, qwen3) with some MLPs replaced by `llm.moe`:

- `mixtral`: every layer; `block_sparse_moe.gate` routes by softmax to `num_experts_per_tok` of
  `num_local_experts` experts (`experts.E.w1` gate, `w3` up, `w2` down), weights renormalised;
- `qwen2_moe`: layers `l` with `(l + 1) % decoder_sparse_step == 0` not in `mlp_only_layers`;
  `mlp.gate` routes by softmax to `mlp.experts.E.{gate,up,down}_proj` (renormalised if
  `norm_topk_prob`), plus `mlp.shared_expert` times sigmoid(`mlp.shared_expert_gate`);
- `qwen3_moe`: as qwen2_moe without the shared expert, with qwen3's attention;
- `deepseek_v2`: layers from `first_k_dense_replace` on; `mlp.gate` routes by softmax (greedy or
  group-limited), weights times `routed_scaling_factor`, plus `mlp.shared_experts`.

Per-expert tensors are referenced where they are (one `core.weight` each) and stacked into the
`[experts, out, in]` operands by `core.concat` of `core.unsqueeze`d views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmir_core.builder import Builder
from llmir_core.ir.core import Value
from llmir_core.ir.types import DType

from .llm_graph import DecoderConfig, MoeSpec

if TYPE_CHECKING:
    from .hf import _Cfg

# model_type -> the dense architecture whose attention and defaults it shares
MOE_ARCHS = {
    "mixtral": "mistral",
    "qwen2_moe": "qwen2",
    "qwen3_moe": "qwen3",
    "deepseek_v2": "llama",  # its own attention (MLA, hf_deepseek)
}

_EXPERT = {
    "mixtral": (
        "block_sparse_moe.experts.{e}.w1",
        "block_sparse_moe.experts.{e}.w3",
        "block_sparse_moe.experts.{e}.w2",
    )
}
_QWEN_EXPERT = ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj")
_ROUTER = {"mixtral": "block_sparse_moe.gate"}


def _int(cfg: _Cfg, *keys: str) -> int:
    """The first of `keys` the file sets (transformers 5 renamed num_experts: both are read),
    else the first with a class default."""
    present = [k for k in keys if cfg.data.get(k) is not None]
    for k in present or list(keys):
        v = cfg.get(k)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise cfg.fail(k, f"must be a non-negative integer, got {v!r}")
            return v
    raise cfg.fail(keys[0], "is missing", hint=f"a {cfg.arch} config.json must set {keys[0]}")


def moe_layers(cfg: _Cfg, layers: int, intermediate: int) -> list[MoeSpec | None]:
    """Which layers are MoE and how they route (None: a dense MLP of `intermediate`)."""
    arch = cfg.arch
    experts = (
        _int(cfg, "num_local_experts", "num_experts")
        if arch == "mixtral"
        else _int(cfg, "n_routed_experts", "num_experts")
        if arch == "deepseek_v2"
        else _int(cfg, "num_experts", "num_local_experts")
    )
    top_k = _int(cfg, "num_experts_per_tok")
    if not 1 <= top_k <= max(experts, 1):
        raise cfg.fail(
            "num_experts_per_tok",
            f"({top_k}) must be between 1 and the number of experts ({experts})",
        )
    if arch == "mixtral":
        spec = MoeSpec(experts, top_k, intermediate, norm_topk=True)
        return [spec] * layers
    if arch == "deepseek_v2":
        from .hf_deepseek import deepseek_moe_layers

        return deepseek_moe_layers(cfg, layers, experts, top_k)
    inter = _int(cfg, "moe_intermediate_size")
    shared = _int(cfg, "shared_expert_intermediate_size") if arch == "qwen2_moe" else 0
    spec = MoeSpec(
        experts,
        top_k,
        inter,
        norm_topk=bool(cfg.get("norm_topk_prob")),
        shared_inter=shared,
        shared_gate=shared > 0,
    )
    step = _int(cfg, "decoder_sparse_step") or 1
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise cfg.fail("mlp_only_layers", "must be a list of layer indices")
    return [
        spec if experts > 0 and (i + 1) % step == 0 and i not in dense else None
        for i in range(layers)
    ]


def _moe_name(dc: DecoderConfig, key: str, layer: int, expert: int | None = None) -> str:
    """The checkpoint tensor of a `moe.*` key (of expert `expert` for the expert weights)."""
    arch = dc.arch
    part = key.removeprefix("moe.")
    if part == "router":
        rel = _ROUTER.get(arch, "mlp.gate")
    elif part in ("w_gate", "w_up", "w_down"):
        names = _EXPERT.get(arch, _QWEN_EXPERT)
        rel = names[("w_gate", "w_up", "w_down").index(part)].format(e=expert)
    elif part == "shared_router":
        rel = "mlp.shared_expert_gate"
    else:
        shared = "mlp.shared_experts." if arch == "deepseek_v2" else "mlp.shared_expert."
        rel = shared + part.removeprefix("shared_") + "_proj"
    return f"model.layers.{layer}.{rel}.weight"


def _moe_shape(dc: DecoderConfig, key: str, layer: int) -> tuple[int, ...]:
    """The shape config.json implies for a `moe.*` key (one expert's, for expert weights)."""
    spec = dc.moe[layer]
    assert spec is not None, f"layer {layer} has no experts"
    h = dc.hidden
    return {
        "moe.router": (spec.experts, h),
        "moe.w_gate": (spec.inter, h),
        "moe.w_up": (spec.inter, h),
        "moe.w_down": (h, spec.inter),
        "moe.shared_gate": (spec.shared_inter, h),
        "moe.shared_up": (spec.shared_inter, h),
        "moe.shared_down": (h, spec.shared_inter),
        "moe.shared_router": (1, h),
    }[key]


def moe_weights(base: type) -> type:
    """An HFWeights subclass that also serves the `moe.*` keys of `llm_graph._Graph.moe`."""

    class MoEWeights(base):  # type: ignore[misc, valid-type]
        def _moe_name(self, key: str, layer: int, expert: int | None = None) -> str:
            return _moe_name(self.dc, key, layer, expert)

        def _moe_shape(self, key: str, layer: int) -> tuple[int, ...]:
            return _moe_shape(self.dc, key, layer)

        def _expected(self, key: str) -> tuple[int, ...]:
            if self.dc.mla is not None and key.startswith("self_attn."):
                from .hf_deepseek import mla_shapes

                return mla_shapes(self.dc)[key]
            return tuple(super()._expected(key))

        def has(self, key: str, layer: int | None = None) -> bool:
            if key.startswith("moe.") and layer is not None:
                return self._moe_name(key, layer, 0) in self.index
            return bool(super().has(key, layer))

        def origin(self, key: str, layer: int | None = None) -> str:
            if key.startswith("moe.") and layer is not None:
                name = self._moe_name(key, layer, 0).removesuffix(".weight")
                return str(self.prefix + name.replace(".experts.0.", ".experts."))
            return str(super().origin(key, layer))

        def _one(self, b: Builder, name: str, want: tuple[int, ...]) -> Value:
            from llmir_core.errors import InputError

            from .hf import emit_weight

            e = self.index.get(name)
            if e.shape != want:
                raise InputError(
                    f"{e.file}: tensor '{e.name}' has shape {list(e.shape)}, but config.json "
                    f"implies {list(want)}",
                    hint="config.json and the weights do not match",
                )
            v = emit_weight(b, e, self.base_dir)
            if e.dtype != DType.f32:
                v = b.op("core.cast", v, to=DType.f32, name_hint=e.name + ".f32")
            return v

        def weight(self, b: Builder, key: str, layer: int | None = None) -> Value:
            if not key.startswith("moe.") or layer is None:
                return super().weight(b, key, layer)
            ck = (key, layer)
            if ck in self._cache:
                return self._cache[ck]  # type: ignore[no-any-return]
            want = self._moe_shape(key, layer)
            if key in ("moe.w_gate", "moe.w_up", "moe.w_down"):
                parts = [
                    b.op(
                        "core.unsqueeze",
                        self._one(b, self._moe_name(key, layer, e), want),
                        axes=(0,),
                    )
                    for e in range(self.dc.moe[layer].experts)
                ]
                v = (
                    parts[0]
                    if len(parts) == 1
                    else b.op("core.concat", *parts, axis=0, name_hint=f"layers.{layer}.{key}")
                )
            else:
                v = self._one(b, self._moe_name(key, layer), want)
            self._cache[ck] = v
            return v

    return MoEWeights


__all__ = ["MOE_ARCHS", "moe_layers", "moe_weights"]
