"""numpy-ext: a whole llmir target in one file of another package, registered by one entry
point (`llmir.targets`: numpy-ext = llmir_ext_demo.target:TARGET).

The artifact is the lowered module (model.llmir) and a manifest; the runtime is llmir's numpy
interpreter plus one native kernel, for `ext.swish_beta`. The target declares that kernel (its
capabilities list the op) and its lowering keeps the op; every other extension op that has a
decomposition (`ext.soft_clip`) is replaced by it, since this runtime has no kernel for it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from llmir_core.builder import Builder
from llmir_core.dialects.registry import get_op
from llmir_core.errors import InputError
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, TensorType
from llmir_core.passes.base import PassContext, take_over
from llmir_core.targets.contract import Capabilities

NAME = "numpy-ext"
MODEL = "model.llmir"
NATIVE = frozenset({"ext.swish_beta"})  # the extension ops this runtime has a kernel for
CALLS: dict[str, int] = {}  # native kernel -> times run (in this process)


def swish_beta_kernel(x: np.ndarray, beta: float) -> np.ndarray:
    """The runtime's own kernel for ext.swish_beta (in the input's dtype)."""
    CALLS["ext.swish_beta"] = CALLS.get("ext.swish_beta", 0) + 1
    return (x / (1 + np.exp(-np.asarray(beta, x.dtype) * x))).astype(x.dtype)


def _expand(fn: Function, op: Op) -> tuple[list[Op], list[Value]] | None:
    """op's decomposition over op's own operands, named apart from fn's values (None: it has
    none)."""
    od = get_op(op.name)
    if od is None or od.decompose is None:
        return None
    ops: list[Op] = []
    outs = od.decompose(
        Builder(fn, ops, prefix="ext"), list(op.operands), od.with_defaults(op.attrs)
    )
    return ops, outs


@dataclass(frozen=True)
class LowerNumpyExt:
    """Extension ops this runtime has no kernel for -> their decompositions (every ext op has
    one); then the module is checked against the capabilities and marked lowered for
    numpy-ext."""

    name: ClassVar[str] = "lower-numpy-ext"
    summary: ClassVar[str] = "decompose the ops numpy-ext has no kernel for; mark the module"

    def run(self, module: Module, ctx: PassContext) -> bool:
        for fn in module.functions:
            ops: list[Op] = []
            swaps: list[tuple[Value, Value]] = []
            for op in fn.ops:
                native = not op.name.startswith("ext.") or op.name in NATIVE
                got = None if native else _expand(fn, op)
                if got is None:
                    ops.append(op)
                else:
                    ops.extend(got[0])
                    swaps.extend(zip(op.results, got[1]))
                    ctx.applied(f"decompose {op.name}", op.results[0])
            fn.ops = ops
            for old, new in swaps:
                take_over(fn, old, new)
        problems = TARGET.capabilities.check(module)
        if problems:
            raise InputError(f"{NAME}: {problems[0].message}", hint="pick another --target")
        module.attrs["target"] = NAME
        return True


def _signature(values: list[Value], names: list[str]) -> list[dict[str, Any]]:
    out = []
    for n, v in zip(names, values):
        t = v.type
        assert isinstance(t, TensorType) and isinstance(t.dtype, DType)
        shape = [d if isinstance(d, int) else str(d) for d in t.shape]
        out.append({"name": n, "dtype": str(t.dtype), "shape": shape})
    return out


class ExtInterpreter(Interpreter):
    """llmir's numpy interpreter, with this runtime's native kernels in place of the ops'
    reference semantics."""

    def eval_op(self, op: Op, args: list[Any], env: dict[str, int] | None = None) -> list[Any]:
        if op.name == "ext.swish_beta":
            return [swish_beta_kernel(args[0], float(op.attrs.get("beta", 1.0)))]
        return super().eval_op(op, args, env)


class Runner:
    """The tensor runner of a numpy-ext artifact."""

    def __init__(self, artifact_dir: str) -> None:
        from llmir_core.ir.parser import parse_file

        self.module = parse_file(os.path.join(artifact_dir, MODEL))
        fn = self.module.main
        self.input_names = list(fn.attrs.get("input_names") or [a.name for a in fn.args])
        self.output_names = list(fn.attrs.get("output_names") or [v.name for v in fn.outputs])

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = ExtInterpreter(self.module).run([inputs[n] for n in self.input_names])
        return dict(zip(self.output_names, (np.asarray(o) for o in outs)))


@dataclass
class NumpyExtTarget:
    name: str = NAME
    dialects: tuple[str, ...] = ("llmir_ext_demo.ops",)
    passes: tuple[str, ...] = ("llmir_ext_demo.target:LowerNumpyExt",)
    options: tuple[Any, ...] = ()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            # core ops, and every ext op: natively (NATIVE) or through its decomposition
            frozenset({"core.*", "ext.*"}),
            frozenset({"f32", "f64", "i64", "i32", "bool"}),
            frozenset({"cpu"}),
        )

    def lowering(self, options: Mapping[str, Any]) -> list[Any]:
        if options:
            raise InputError(f"{NAME} takes no build options, got {', '.join(sorted(options))}")
        return [LowerNumpyExt()]

    def serialize(
        self,
        module: Module,
        out_dir: str,
        *,
        source_path: str | None = None,
        lowered_text: str | None = None,
    ) -> dict[str, Any]:
        from llmir_core.ir.printer import print_module

        if any(op.name == "core.weight" for fn in module.functions for op in fn.ops):
            raise InputError(f"{NAME} builds weight-free modules only (a demo target)")
        text = (lowered_text or print_module(module)).encode()
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, MODEL), "wb") as fh:
            fh.write(text)
        fn = module.main
        manifest = {
            "target": NAME,
            "model": MODEL,
            "files": {MODEL: {"sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}},
            "inputs": _signature(
                fn.args, list(fn.attrs.get("input_names") or []) or [a.name for a in fn.args]
            ),
            "outputs": _signature(
                fn.outputs, list(fn.attrs.get("output_names") or []) or [v.name for v in fn.outputs]
            ),
        }
        with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1)
        return manifest

    def open(self, artifact_dir: str, **options: Any) -> Runner:
        return Runner(artifact_dir)


TARGET = NumpyExtTarget()
