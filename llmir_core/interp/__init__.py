"""The numpy reference interpreter: the executable meaning of every op.

`run(module, inputs)` evaluates a function op by op with each op's declared reference semantics
(or, for an op that only declares a decomposition, by evaluating its decomposition). It binds the
named symbolic dims of the inputs, checks every input and (by default) every intermediate result
against its declared type, and reports mismatches with the op's location.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from llmir_core.dialects.registry import get_op
from llmir_core.errors import CheckFailed, InputError
from llmir_core.ir.core import Function, Module, Op
from llmir_core.ir.dims import DYN, SymDim, eval_dim, format_dim
from llmir_core.ir.types import KVCacheType, QuantType, TensorType, Type, numpy_dtype
from llmir_core.weights import PackedArray, WeightRefError, load_weight


class InterpError(CheckFailed):
    """An op's result disagrees with its declared type, or the op cannot run."""


def _bind_shape(
    shape: tuple[int, ...], t: TensorType, env: dict[str, int], what: str
) -> str | None:
    """Bind/check dims; return an error message or None."""
    if len(shape) != t.rank:
        return f"{what} has rank {len(shape)} {list(shape)}, expected rank {t.rank} ({t})"
    deferred = []
    for i, (actual, d) in enumerate(zip(shape, t.shape)):
        if isinstance(d, int):
            if actual != d:
                return f"{what} dim {i} is {actual}, expected {d} ({t})"
        elif (
            isinstance(d, SymDim)
            and len(d.terms) == 1
            and d.terms[0][1] == 1
            and len(d.terms[0][0]) == 1
            and d.const == 0
        ):
            name = d.terms[0][0][0]
            if name in env and env[name] != actual:
                return f"{what} dim {i} is {actual}, but ?{name} is {env[name]} elsewhere"
            env[name] = actual
        elif isinstance(d, SymDim):
            deferred.append((i, actual, d))
    for i, actual, d in deferred:
        v = eval_dim(d, env)
        if v is not None and v != actual:
            return f"{what} dim {i} is {actual}, expected {format_dim(d)} = {v}"
    return None


def _dtype_ok(arr: Any, t: Type) -> bool:
    if isinstance(t, KVCacheType):
        return True
    if isinstance(t.dtype, QuantType):
        return isinstance(arr, PackedArray) and arr.qtype == t.dtype
    return isinstance(arr, np.ndarray) and arr.dtype == numpy_dtype(t.dtype)


class Interpreter:
    def __init__(self, module: Module, check_types: bool = True) -> None:
        self.module = module
        self.check_types = check_types
        self.base_dir = (
            os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
        )
        self.trace: list[tuple[Op, list[Any]]] | None = None

    def run(
        self, inputs: Mapping[str, Any] | Sequence[Any], fn_name: str | None = None
    ) -> list[Any]:
        if not self.module.functions:
            raise InputError("the module has no function to run")
        if fn_name is None:
            return self.run_function(self.module.main, inputs)
        try:
            fn = self.module.function(fn_name)
        except KeyError:
            names = ", ".join("@" + f.name for f in self.module.functions)
            raise InputError(
                f"no function @{fn_name} in the module", hint=f"its functions: {names}"
            ) from None
        return self.run_function(fn, inputs)

    def bind_inputs(
        self, fn: Function, inputs: Mapping[str, Any] | Sequence[Any]
    ) -> tuple[dict[int, Any], dict[str, int]]:
        if isinstance(inputs, Mapping):
            missing = [a.name for a in fn.args if a.name not in inputs]
            extra = [k for k in inputs if k not in {a.name for a in fn.args}]
            if missing:
                raise InputError(
                    f"missing input(s): {', '.join(missing)}",
                    hint=f"@{fn.name} takes " + ", ".join(f"{a.name}: {a.type}" for a in fn.args),
                )
            if extra:
                raise InputError(
                    f"unknown input(s): {', '.join(extra)}",
                    hint="inputs are: " + ", ".join(a.name for a in fn.args),
                )
            values = [inputs[a.name] for a in fn.args]
        else:
            values = list(inputs)
            if len(values) != len(fn.args):
                raise InputError(f"@{fn.name} takes {len(fn.args)} inputs, got {len(values)}")
        env: dict[str, int] = {}
        vals: dict[int, Any] = {}
        for a, v in zip(fn.args, values):
            t = a.type
            if isinstance(t, TensorType):
                if not isinstance(t.dtype, QuantType):
                    v = np.asarray(v)
                    if v.dtype != numpy_dtype(t.dtype):
                        raise InputError(f"input {a.name} has dtype {v.dtype}, expected {t.dtype}")
                msg = _bind_shape(
                    tuple(np.shape(v) if not isinstance(v, PackedArray) else v.shape),
                    t,
                    env,
                    f"input {a.name}",
                )
                if msg:
                    raise InputError(msg)
            vals[id(a)] = v
        return vals, env

    def run_function(
        self,
        fn: Function,
        inputs: Mapping[str, Any] | Sequence[Any],
        env: dict[str, int] | None = None,
    ) -> list[Any]:
        vals, bound = self.bind_inputs(fn, inputs)
        env = {**(env or {}), **bound}
        # drop each value after its last use, so a long function does not hold every activation
        last_use: dict[int, int] = {}
        for i, op in enumerate(fn.ops):
            for v in op.operands:
                last_use[id(v)] = i
        for v in fn.outputs:
            last_use[id(v)] = len(fn.ops)
        for i, op in enumerate(fn.ops):
            args = [vals[id(v)] for v in op.operands]
            outs = self.eval_op(op, args, env)
            if len(outs) != len(op.results):
                raise InterpError(
                    f"{op.name} returned {len(outs)} values, expected {len(op.results)}"
                )
            for r, o in zip(op.results, outs):
                if self.check_types:
                    self._check_result(op, r.type, o, env)
                vals[id(r)] = o
            if self.trace is not None:
                self.trace.append((op, outs))
            for v in op.operands:
                if last_use.get(id(v)) == i:
                    vals.pop(id(v), None)
        return [vals[id(v)] for v in fn.outputs]

    def _check_result(self, op: Op, t: Type, o: Any, env: dict[str, int]) -> None:
        where = f"{op.pos}: " if op.pos else ""
        origin = f" [{op.origin}]" if op.origin else ""
        if not _dtype_ok(o, t):
            got = o.dtype if hasattr(o, "dtype") else type(o).__name__
            raise InterpError(f"{where}{op.name} produced dtype {got}, declared {t}{origin}")
        if isinstance(t, TensorType):
            shape = o.shape if isinstance(o, PackedArray) else np.shape(o)
            msg = _bind_shape(tuple(shape), t, env, f"{op.name} result")
            if msg:
                raise InterpError(f"{where}{msg}{origin}")

    def eval_op(self, op: Op, args: list[Any], env: dict[str, int] | None = None) -> list[Any]:
        if op.name == "core.weight":
            t = op.results[0].type
            assert isinstance(t, TensorType)
            try:
                return [load_weight(op.attrs, t, self.base_dir)]
            except WeightRefError as exc:
                where = f"{op.pos}: " if op.pos else ""
                raise InterpError(f"{where}core.weight: {exc}") from None
        opdef = get_op(op.name)
        if opdef is None:
            raise InterpError(f"unknown op '{op.name}'")
        attrs = opdef.with_defaults(op.attrs)
        # references that take symbolic dims in attributes (reshape targets) evaluate them here
        attrs["__env__"] = env if env is not None else {}
        if opdef.reference is not None:
            try:
                with np.errstate(all="ignore"):
                    out = opdef.reference(args, attrs)
            except (ValueError, IndexError, TypeError, ArithmeticError) as exc:
                where = f"{op.pos}: " if op.pos else ""
                origin = f" [{op.origin}]" if op.origin else ""
                raise InterpError(f"{where}{op.name} failed at run time: {exc}{origin}") from exc
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            # a numpy scalar (np.float32(...)) from a 0-d reduction is still a 0-d array
            return [np.asarray(o) if isinstance(o, np.generic) else o for o in outs]
        if opdef.decompose is not None:
            return self._eval_decomposed(op, args, env)
        raise InterpError(f"{op.name} has neither reference semantics nor a decomposition")

    def _eval_decomposed(self, op: Op, args: list[Any], env: dict[str, int] | None) -> list[Any]:
        from llmir_core.builder import Builder
        from llmir_core.ir.core import Value

        fn = Function(f"{op.name}.decomposed", [])
        params = [Value(f"a{i}", v.type) for i, v in enumerate(op.operands)]
        fn.args = params
        b = Builder(fn)
        opdef = get_op(op.name)
        assert opdef is not None and opdef.decompose is not None
        fn.outputs = opdef.decompose(b, params, opdef.with_defaults(op.attrs))
        sub = Interpreter(self.module, self.check_types)
        return sub.run_function(fn, args, env)


def run(
    module: Module,
    inputs: Mapping[str, Any] | Sequence[Any],
    fn: str | None = None,
    check_types: bool = True,
) -> list[Any]:
    """Evaluate `fn` (default: main) on numpy inputs; return its outputs."""
    return Interpreter(module, check_types).run(inputs, fn)


__all__ = ["run", "Interpreter", "InterpError", "DYN"]
