"""The `triton` target (CONTRACT.md): llmir's Triton kernels on a CUDA GPU.

- `lowering(options)`: fuse-add-rms-norm, fuse-linear, then lower-triton (options `kv_cache`
  native|int8, `split_k`), so `llmir optimize --target triton` shows each kernel launch.
- `serialize(module, out_dir)`: writes (temp + rename) `model.llmir` (the lowered module),
  `weights.bin` with the build-time values in the kernels' layouts (float weights as they are;
  GGUF q8_0/q4_0 blocks and symmetric nbits weights repacked losslessly into codes + scales;
  rotary tables precomputed), `kernels/` with PTX and cubin compiled ahead of time for each
  architecture of the `arch` option (`--target-opt arch=sm_80,sm_90`, the default: the main
  specialization of every kernel the module launches, in its dtype; other specializations
  compile at load, cached) and the manifest (`"target": "triton"`, sha256 of every file, each
  AOT kernel's entry, the build options as `target_options`).
- `open(dir)`: a `TritonDecoder` (runner.py) implementing the Decoder protocol. It needs a CUDA
  device, except under TRITON_INTERPRET=1 (the CPU tests); otherwise it exits 2 with "this
  artifact needs a CUDA GPU (none found)".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.errors import Diagnostic, InputError
from llmir_core.ir.core import Module
from llmir_core.ir.types import DType, TensorType
from llmir_core.targets.contract import TargetOption
from llmir_core.targets.triton.plan import RUNTIME_OPS, split_static, static_leaves

NAME = "triton"
MODEL_FILE = "model.llmir"
WEIGHTS_FILE = "weights.bin"
KERNEL_DIR = "kernels"
ALIGN = 256


@dataclass(frozen=True)
class Capabilities:
    """What the target runs after lowering (the contract's Capabilities; the lead may swap in the
    shared class from llmir_core.targets.contract, same fields)."""

    ops: frozenset[str]
    dtypes: frozenset[str]
    devices: frozenset[str]

    def check(self, module: Module) -> list[Diagnostic]:
        out: list[Diagnostic] = []
        for fn in module.functions:
            _, step = split_static(fn)
            for op in step:
                if op.name not in self.ops:
                    out.append(
                        Diagnostic(
                            "error",
                            f"op '{op.name}' has no triton kernel (the triton target runs "
                            f"{', '.join(sorted(o for o in self.ops if o.startswith('triton.')))} "
                            "and layout/elementwise glue)",
                            op.pos,
                            op.origin,
                        )
                    )
                    continue
                for v in (*op.operands, *op.results):
                    t = v.type
                    if (
                        isinstance(t, TensorType)
                        and isinstance(t.dtype, DType)
                        and t.dtype.is_float
                        and str(t.dtype) not in self.dtypes
                    ):
                        out.append(
                            Diagnostic(
                                "error",
                                f"op '{op.name}' computes in {t.dtype}; the triton target "
                                f"computes in {', '.join(sorted(self.dtypes))}",
                                op.pos,
                                op.origin,
                            )
                        )
                        break
        return out


CAPABILITIES = Capabilities(
    ops=RUNTIME_OPS, dtypes=frozenset({"f32", "f16", "bf16"}), devices=frozenset({"cuda"})
)


def _is_lowered(module: Module) -> bool:
    return any(op.name.startswith("triton.") for fn in module.functions for op in fn.ops)


OPTIONS = (
    TargetOption(
        "arch",
        "str",
        "CUDA architectures to compile the kernels for ahead of time, e.g. sm_80,sm_90; none: "
        "every kernel compiles when the artifact loads (cached).",
        "sm_80,sm_90",
    ),
    TargetOption(
        "max_len",
        "int",
        "KV-cache positions the runner allocates at most; unset: the model's context.",
    ),
    TargetOption(
        "kv_cache",
        "str",
        "KV-cache storage: native (the compute dtype) or int8 (with per-position scales).",
        "native",
        ("native", "int8"),
    ),
    TargetOption(
        "split_k",
        "int",
        "Decode attention: the number of cache slices (flash-decoding); 0: chosen by the "
        "cache capacity.",
        0,
    ),
)


def _archs(arch: str) -> list[int]:
    """The `arch` option as compute capabilities ("none": no ahead-of-time kernels)."""
    from llmir_core.targets.triton.aot import parse_archs

    if arch == "none":
        return []
    try:
        return parse_archs(arch)
    except InputError:
        raise InputError(
            f"--target-opt arch must be CUDA architectures such as sm_80,sm_90, or none; "
            f"got {arch!r}",
            hint="e.g. --target-opt arch=sm_80 (none: kernels compile when the artifact loads)",
        ) from None


class TritonTarget:
    name = NAME
    capabilities = CAPABILITIES
    dialects = ("llmir_core.targets.triton.dialect",)
    passes = ("llmir_core.targets.triton.lower:LowerTriton",)
    options = OPTIONS

    def check_options(self, module: Module, options: Mapping[str, Any]) -> None:
        """arch names CUDA architectures (sm_NN, comma-separated) or none; max_len >= 1;
        split_k >= 0."""
        if "arch" in options:
            _archs(str(options["arch"]))
        if options.get("max_len") is not None and int(options["max_len"]) < 1:
            raise InputError(f"--target-opt max_len must be >= 1, got {options['max_len']}")
        if int(options.get("split_k", 0)) < 0:
            raise InputError(f"--target-opt split_k must be >= 0, got {options['split_k']}")

    def lowering(self, options: Mapping[str, Any]) -> list[Any]:
        """fuse-add-rms-norm, fuse-linear, lower-triton (kv_cache, split_k); arch and max_len
        are read by the serializer from the options the lowered module records."""
        from llmir_core.passes import PASSES

        kv = str(options.get("kv_cache", "native"))
        if kv not in ("native", "int8"):
            raise InputError(f"--target-opt kv_cache must be one of native, int8, got {kv!r}")
        split_k = int(options.get("split_k", 0))
        return [
            PASSES["fuse-add-rms-norm"](),
            PASSES["fuse-linear"](),
            PASSES["lower-triton"](kv_cache=kv, split_k=split_k),
        ]

    def serialize(
        self,
        module: Module,
        out_dir: str,
        *,
        source_path: str | None = None,
        arch: str | None = None,
        kv_cache: str | None = None,
        max_len: int | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        """arch, kv_cache, max_len: given here, else the options the lowered module records
        (`llmir.target_options`), else the defaults. "none" arch: no ahead-of-time kernels (all
        compile at load, cached)."""
        from llmir_core.passes.base import PassContext, clone_module
        from llmir_core.targets.options import MODULE_ATTR, effective

        recorded = module.attrs.get(MODULE_ATTR)
        given = {"arch": arch, "kv_cache": kv_cache, "max_len": max_len}
        opts = effective(self, dict(recorded) if isinstance(recorded, dict) else {})
        opts.update({k: v for k, v in given.items() if v is not None})
        archs = _archs(str(opts["arch"]))
        if not _is_lowered(module):
            module = clone_module(module)
            ctx = PassContext()
            for p in self.lowering(opts):
                p.run(module, ctx)
        return write_artifact(
            module,
            out_dir,
            archs,
            source_path=source_path,
            max_len=opts["max_len"],
            target_options=opts,
        )

    def open(self, artifact_dir: str, **options: Any) -> Any:
        from llmir_core.targets.triton.runner import open_decoder

        return open_decoder(artifact_dir, **options)

    def open_batch(self, artifact_dir: str, slots: int, **options: Any) -> Any:
        """`slots` TritonDecoders run one sequence at a time (no batched triton runner yet)."""
        from llmir_core.runtime.batch_decoder import SerialBatchDecoder

        return SerialBatchDecoder.over(lambda: self.open(artifact_dir, **options), slots)


TARGET = TritonTarget()


def _check_decoder(module: Module) -> Any:
    from llmir_core.runtime.decoder import cache_specs

    fn = module.main
    specs = cache_specs(fn)
    if len(fn.outputs) != 1 + len(specs):
        raise InputError(
            f"@{fn.name} must return logits and one present per cache input "
            f"({1 + len(specs)} values), returns {len(fn.outputs)}"
        )
    errors = CAPABILITIES.check(module)
    if errors:
        d = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InputError(
            d.header() + more,
            hint="build it with --target onnxruntime, or run "
            "`llmir optimize --target triton` to see what stays unlowered",
        )
    return specs


def _repack(op: Any, packed: Any) -> dict[str, np.ndarray]:
    """A triton.q_matmul weight in the kernels' layout (lossless; nbits scales are their own value)."""
    q = packed.qtype
    n, k = packed.shape
    if q.scheme in ("q8_0", "q4_0"):
        blocks = np.asarray(packed.data, np.uint8).reshape(
            n, k // 32, 34 if q.scheme == "q8_0" else 18
        )
        scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(n, k // 32)
        codes = np.ascontiguousarray(blocks[:, :, 2:]).reshape(n, -1)
        return {"codes": codes.view(np.int8) if q.scheme == "q8_0" else codes, "scales": scales}
    if q.scheme == "nbits" and q.bits in (4, 8) and q.zero == "none":
        c = np.asarray(packed.data, np.uint8).reshape(n, -1)
        return {"codes": (c.astype(np.int16) - 128).astype(np.int8) if q.bits == 8 else c}
    raise InputError(
        f"weight of {op.name} at {op.pos}: format {q} has no triton kernel "
        "(GGUF q8_0/q4_0 and symmetric 4/8-bit nbits do)"
    )


def write_artifact(
    module: Module,
    out_dir: str,
    archs: list[int],
    *,
    source_path: str | None = None,
    max_len: int | None = None,
    target_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The triton artifact of a lowered decoder module in out_dir (through the shared
    `ArtifactWriter`: temp folder, manifest with every file's sha256, rename); the manifest."""
    from llmir_core.artifact import ArtifactWriter, manifest_head, source_record
    from llmir_core.ir.printer import print_module
    from llmir_core.targets.triton.dialect import KERNELS

    specs = _check_decoder(module)
    if max_len is not None and max_len < 1:
        raise InputError(f"--max-len must be >= 1, got {max_len}")
    fn = module.main
    with ArtifactWriter(out_dir) as w:
        index = _write_weights(module, w.path(WEIGHTS_FILE))
        w.add(WEIGHTS_FILE)
        _, step_ops = split_static(fn)
        used = sorted({k for op in step_ops for k in KERNELS.get(op.name, ())})
        dt = fn.outputs[0].type.dtype if isinstance(fn.outputs[0].type, TensorType) else DType.f32
        kernels = _write_kernels(w, str(dt), archs, used)
        w.write_text(MODEL_FILE, print_module(module))
        decoder = _decoder_section(module, specs, str(dt), max_len)
        decoder["tokenizer"] = w.write_tokenizer(module)
        decoder["chat_template"] = w.write_chat_template(module)
        head = manifest_head(
            NAME,
            model=MODEL_FILE,
            source=source_record(module, source_path),
            pipeline=module.attrs.get("llmir.pipeline"),
            builder="decoder",
            target_options=target_options,
        )
        return w.finish(
            {
                **head,
                "weights": WEIGHTS_FILE,
                "weight_index": index,
                "dtype": str(dt),
                "archs": [f"sm_{a}" for a in archs],
                "kernels": kernels,
                "kernel_ops": used,
                "decoder": decoder,
            }
        )


def _write_weights(module: Module, path: str) -> dict[str, Any]:
    """The build-time values the step reads (weights in the kernels' layouts, rotary tables:
    computed once here, numpy reference semantics) written to `path`; their index."""
    from llmir_core.interp import Interpreter
    from llmir_core.weights import PackedArray

    fn = module.main
    interp = Interpreter(module, check_types=False)
    static_ops, step_ops = split_static(fn)
    leaves = set(static_leaves(fn))
    consumers = {id(v): op for op in step_ops for v in op.operands}
    vals: dict[int, Any] = {}
    index: dict[str, Any] = {}
    with open(path, "wb") as wf:

        def put(arr: np.ndarray) -> dict[str, Any]:
            wf.write(b"\0" * ((-wf.tell()) % ALIGN))
            a = np.ascontiguousarray(arr)
            entry = {"offset": wf.tell(), "dtype": str(a.dtype), "shape": list(a.shape)}
            wf.write(a.tobytes())
            return {**entry, "nbytes": a.nbytes}

        for op in static_ops:
            outs = interp.eval_op(op, [vals[id(v)] for v in op.operands], {})
            for r, o in zip(op.results, outs):
                vals[id(r)] = o
                if r.name not in leaves:
                    continue
                if isinstance(o, PackedArray):
                    parts = _repack(consumers.get(id(r), op), o)
                    index[r.name] = {
                        "quant": o.qtype.scheme,
                        "shape": list(o.shape),
                        **{k: put(v) for k, v in parts.items()},
                    }
                else:
                    index[r.name] = put(np.asarray(o))
    return index


def _write_kernels(w: Any, dtype: str, archs: list[int], used: list[str]) -> list[dict[str, Any]]:
    """The kernels compiled ahead of time for `archs` into KERNEL_DIR (listed in the manifest's
    files, so they are hashed like the rest); their entries."""
    from llmir_core.targets.triton.aot import compile_in_subprocess

    if not archs:
        return []
    kernels = compile_in_subprocess(
        dtype if dtype in ("f32", "f16", "bf16") else "f32",
        archs,
        w.path(KERNEL_DIR),
        set(used),
        one_each=True,
    )
    for e in kernels:
        for kind in ("ptx", "cubin"):
            e[kind]["file"] = f"{KERNEL_DIR}/{e[kind]['file']}"
            w.add(e[kind]["file"])
    return kernels


def _decoder_section(module: Module, specs: Any, dtype: str, max_len: int | None) -> dict[str, Any]:
    """The manifest's `decoder` section (the writer adds tokenizer and chat_template)."""
    from llmir_core.artifact import jsonable

    fn = module.main
    _, step_ops = split_static(fn)
    ctx = module.attrs.get("llm.context_length")
    kv_i8 = any(
        op.name == "triton.kv_append" and op.attrs.get("cache_dtype") == "i8" for op in step_ops
    )
    heads = next(
        (_shape(op.operands[0])[1] for op in step_ops if op.name == "triton.attention"), None
    )
    return {
        "layers": len(specs) // 2,
        "vocab": fn.outputs[0].type.shape[-1],  # type: ignore[union-attr]
        "max_len": max_len or (int(ctx) if isinstance(ctx, int) else None),
        "context_length": ctx,
        "heads": heads,
        "kv_cache": "int8" if kv_i8 else "native",
        "quant": {"f32_weights": _weights_kind(module, dtype)},
        "cache": [{"input": s.name, "kv_heads": s.kv_heads, "head_dim": s.head_dim} for s in specs],
        "eos_token_ids": [int(e) for e in module.attrs.get("llm.eos_token_ids") or ()],
        "bos_token_id": module.attrs.get("llm.bos_token_id"),
        "generation": jsonable(module.attrs.get("llm.generation") or {}),
        "architecture": module.attrs.get("llm.architecture"),
    }


def _weights_kind(module: Module, dtype: str) -> str:
    """int4 / int8 when projections read quantized weights, else the compute dtype."""
    for op in module.main.ops:
        if op.name == "triton.q_matmul":
            t = op.operands[1].type
            if isinstance(t, TensorType) and not isinstance(t.dtype, DType):
                return f"int{t.dtype.bits}"
    return dtype


def _shape(v: Any) -> tuple[Any, ...]:
    t = v.type
    return tuple(t.shape) if isinstance(t, TensorType) else ()


__all__ = ["TARGET", "TritonTarget", "Capabilities", "CAPABILITIES", "OPTIONS", "write_artifact"]
