"""Hostile cases of llmir's RMS norms (SimplifiedLayerNormalization and
SkipSimplifiedLayerNormalization, norm.c)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .base import F32, F64, Call, Case, Feeds, Scenario, _f, _graph, _overflow_x, _put

# -- norms ---------------------------------------------------------------------------------------


def _norm_cases(skip: bool) -> list[Case]:
    from onnx import TensorProto as T

    op = "SkipSimplifiedLayerNormalization" if skip else "SimplifiedLayerNormalization"
    H = 40

    def ref_for(eps: float) -> Callable[[Feeds], list[np.ndarray]]:
        def ref(f: Feeds) -> list[np.ndarray]:
            x, g = f["x"], f["g"]
            if x.dtype != F32 or g.dtype != F32 or x.ndim < 1 or g.shape != x.shape[-1:]:
                raise ValueError("bad shapes")
            if skip and f["k"].shape != x.shape:
                raise ValueError("bad skip")
            with np.errstate(all="ignore"):
                s = (x + f["k"]).astype(F32) if skip else x
                sf = _f(s)
                y = sf / np.sqrt(np.mean(sf * sf, axis=-1, keepdims=True) + eps) * _f(g)
            return [y.astype(F32), s] if skip else [y.astype(F32)]

        return ref

    def sc(
        shapes: list[tuple[tuple[int, ...], int, str]],
        eps: float = 1e-5,
        xf: Callable[[np.ndarray], None] | None = None,
        outs: list[str] | None = None,
        feed: Callable[[Feeds], Feeds] | None = None,
        alias: dict[str, str] | None = None,
    ) -> Callable[[np.random.Generator], Scenario]:
        def make(rng: np.random.Generator) -> Scenario:
            ins = (
                [("x", T.FLOAT), ("k", T.FLOAT), ("g", T.FLOAT)]
                if skip
                else [("x", T.FLOAT), ("g", T.FLOAT)]
            )
            o = outs or (["y", "", "", "sum"] if skip else ["y"])
            g = _graph(op, ins, o, {"epsilon": eps})
            calls = []
            for xs, h, want in shapes:
                x = rng.standard_normal(xs).astype(F32)
                if xf:
                    xf(x)
                f = {"x": x, "g": rng.standard_normal((h,)).astype(F32)}
                if skip:
                    f["k"] = rng.standard_normal(xs).astype(F32)
                if feed:
                    f = feed(f)
                calls.append(Call(f, want, dict(alias or {})))
            ref = ref_for(eps)
            if outs and skip:
                keep = [i for i, n in enumerate(["y", "sum"]) if n in outs]
                base = ref
                ref = lambda f: [base(f)[i] for i in keep]  # noqa: E731
            return Scenario(g, calls, ref, 1e-6, 1)

        return make

    cases = [
        ("valid-decode", sc([((1, 1, H), H, "ref")])),
        ("valid-prefill", sc([((2, 9, H), H, "ref")])),
        ("valid-h-not-multiple-of-8", sc([((3, 37), 37, "ref")])),
        ("valid-h-large", sc([((2, 4096), 4096, "ref")])),
        ("rows-grow-and-shrink", sc([((1, H), H, "ref"), ((64, H), H, "ref"), ((1, H), H, "ref")])),
        (
            "h-changes-between-calls",
            sc([((2, 64), 64, "ref"), ((2, 8), 8, "ref"), ((2, 1000), 1000, "ref")]),
        ),
        ("scale-too-short", sc([((2, H), H - 1, "error")])),
        ("scale-too-long", sc([((2, H), H + 8, "error")])),
        (
            "scale-rank2",
            sc([((2, H), H, "error")], feed=lambda f: {**f, "g": f["g"].reshape(1, -1)}),
        ),
        ("scale-empty", sc([((2, H), 0, "error")])),
        (
            "x-rank0",
            sc(
                [((), 1, "error")],
                feed=lambda f: {
                    **f,
                    "x": np.asarray(1.0, F32),
                    **({"k": np.asarray(1.0, F32)} if skip else {}),
                },
            ),
        ),
        ("x-rank1", sc([((H,), H, "ref")])),
        ("x-rank9", sc([((1,) * 8 + (H,), H, "error")])),
        ("rows-zero", sc([((0, H), H, "either")])),
        ("h-zero", sc([((3, 0), 0, "either")])),
        ("rows-overflow-int64", lambda rng: _overflow_x(sc([((1, 0), 0, "either")])(rng), skip)),
        ("nan-in-x", sc([((3, H), H, "ref")], xf=_put(np.nan, (5,)))),
        ("inf-in-x", sc([((3, H), H, "ref")], xf=_put(np.inf, (H + 2,)))),
        ("huge-x", sc([((3, H), H, "ref")], xf=lambda a: a.__imul__(F32(1e30)))),
        ("zero-x", sc([((3, H), H, "ref")], xf=lambda a: a.fill(0))),
        ("eps-zero-zero-x", sc([((2, H), H, "ref")], eps=0.0, xf=lambda a: a.fill(0))),
        ("eps-negative", sc([((2, H), H, "either")], eps=-1.0, xf=lambda a: a.__imul__(F32(3)))),
        ("eps-nan", sc([((2, H), H, "either")], eps=float("nan"))),
        ("x-float64", sc([((2, H), H, "error")], feed=lambda f: {**f, "x": f["x"].astype(F64)})),
        (
            "scale-float16",
            sc([((2, H), H, "error")], feed=lambda f: {**f, "g": f["g"].astype(np.float16)}),
        ),
        ("output-aliases-x", sc([((4, H), H, "either")], alias={"y": "x"})),
    ]
    if skip:
        cases += [
            (
                "skip-shape-differs",
                sc([((2, H), H, "error")], feed=lambda f: {**f, "k": f["k"][:1]}),
            ),
            (
                "skip-broadcast-row",
                sc([((3, H), H, "error")], feed=lambda f: {**f, "k": f["k"][:1].copy()}),
            ),
            (
                "skip-rank-differs",
                sc([((2, H), H, "error")], feed=lambda f: {**f, "k": f["k"].reshape(1, 2, H)}),
            ),
            ("no-sum-output", sc([((2, H), H, "ref")], outs=["y"])),
            ("mean-output-asked", sc([((2, H), H, "either")], outs=["y", "mean", "", "sum"])),
        ]
    else:
        cases += [("extra-output-asked", lambda rng: _sln_extra(rng))]
    return [Case(op, n, m) for n, m in cases]


def _sln_extra(rng: np.random.Generator) -> Scenario:
    from onnx import TensorProto as T

    g = _graph("SimplifiedLayerNormalization", [("x", T.FLOAT), ("g", T.FLOAT)], ["y", "inv"])
    f = {"x": rng.standard_normal((2, 16)).astype(F32), "g": rng.standard_normal(16).astype(F32)}
    return Scenario(g, [Call(f, "error")], None)
