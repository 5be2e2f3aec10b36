"""llmir as an `onnx.backend.base.Backend`: import -> (build) -> run.

`LlmirBackend.prepare(model, backend="reference")` imports the ONNX model into llmir and runs it on
the numpy reference interpreter; `backend="onnxruntime"` also builds it with the onnxruntime
backend (in memory) and runs the built model in onnxruntime. Inputs that llmir takes as attributes
(axes, pads, repeats, split sizes, TopK's k, ...) but that the model passes as graph inputs, or
computes from small integer graph inputs, are folded into constants from the values given to `run`
before importing (the ONNX node tests pass every input that way); the import is cached per folded
value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.backend.base import Backend, BackendRep

from llmir_core.ir.core import Module

BACKENDS = ("reference", "onnxruntime")


class LlmirRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.model = model
        self.backend = backend
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self._cache: dict[Any, Any] = {}
        self.folded: list[str] = []

    def _fold(self, names: Sequence[str], values: dict[str, np.ndarray]) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        keep = [i for i in m.graph.input if i.name not in names]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        for n in names:
            m.graph.initializer.append(onnx.numpy_helper.from_array(values[n], n))
        return m

    def module_for(self, values: dict[str, np.ndarray]) -> tuple[Module, Any]:
        """Import (folding attribute-like inputs as needed); returns (module, prepared runner)."""
        from llmir_core.frontends.onnx import NeedsConstantError, import_onnx

        folded: list[str] = list(self.folded)
        while True:
            key = tuple(
                (n, values[n].dtype.str, values[n].shape, values[n].tobytes()) for n in folded
            )
            if key in self._cache:
                return self._cache[key]  # type: ignore[no-any-return]
            model = self._fold(folded, values) if folded else self.model
            try:
                module, _ = import_onnx(model)
            except NeedsConstantError as exc:
                if exc.input_name in values and exc.input_name not in folded:
                    folded.append(exc.input_name)
                    continue
                # computed from graph inputs: fold the small integer ones (shapes, sizes)
                more = [
                    n
                    for n in self.input_names
                    if n not in folded
                    and n in values
                    and values[n].dtype.kind in "iu"
                    and values[n].size <= 64
                ]
                if not more:
                    raise
                folded.extend(more)
                continue
            runner = None
            if self.backend == "onnxruntime":
                from llmir_core.targets import get_target

                runner = get_target("onnxruntime").session_for_module(module)
            self.folded = folded
            self._cache[key] = (module, runner)
            return module, runner

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            values = {k: _array(v) for k, v in inputs.items()}
        else:
            seq = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            values = {n: _array(v) for n, v in zip(self.input_names, seq)}
        module, runner = self.module_for(values)
        from llmir_core.runtime.tensors import run_module

        if runner is None:
            outs = run_module(module, {n: v for n, v in values.items() if n not in self.folded})
        else:
            sess, in_names, _ = runner
            outs = sess.run({n: values[n] for n in in_names})
        return tuple(outs[n] for n in self.output_names)


def _array(v: Any) -> np.ndarray:
    if isinstance(v, onnx.TensorProto):
        return np.asarray(onnx.numpy_helper.to_array(v))
    return np.asarray(v)


class LlmirBackend(Backend):
    """Run ONNX models through llmir (`backend` = reference | onnxruntime)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> LlmirRep:
        super().prepare(model, device, **kwargs)
        return LlmirRep(model, kwargs.get("backend", "reference"))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = LlmirBackend.prepare
run_model = LlmirBackend.run_model
supports_device = LlmirBackend.supports_device

__all__ = ["LlmirBackend", "LlmirRep", "prepare", "run_model", "supports_device"]
