"""Ahead-of-time compilation of the kernels for CUDA architectures, without a GPU.

`compile_kernels(specs, archs, out_dir)` runs `triton.compile(ASTSource(...), target=GPUTarget(
"cuda", cc, 32))` for each specialization (kernels/*.aot_specs) and architecture, writes the PTX
and cubin under out_dir, and returns one manifest entry per (kernel, specialization, arch) with
the files' sha256. Triton's interpreter replaces `@triton.jit` functions when TRITON_INTERPRET is
set, and those cannot be compiled, so `compile_in_subprocess` runs this module with the variable
cleared (tests and builds call that).

    python -m llmir_core.targets.triton.aot --arch sm_80,sm_90 --dtype f16 [--kernels a,b] -o DIR
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from llmir_core.errors import InputError

DEFAULT_ARCHS = ("sm_80", "sm_90")
_PTR = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


def parse_archs(text: str) -> list[int]:
    """ "sm_80,sm_90" -> [80, 90]."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        digits = part[3:] if part.startswith("sm_") else ""
        if not digits.isdigit() or not 50 <= int(digits) <= 120:
            raise InputError(
                f"bad --arch entry {part!r}", hint="write CUDA architectures as sm_80,sm_90"
            )
        out.append(int(digits))
    if not out:
        raise InputError("--arch names no architecture", hint="e.g. --arch sm_80,sm_90")
    return out


def all_specs(dtype: str, kernels: set[str] | None = None, one_each: bool = False) -> list[Any]:
    """The AOT specializations of every kernel (or of `kernels`); one_each: the first per kernel."""
    from llmir_core.targets.triton.kernels import FAMILIES

    specs, seen = [], set()
    for fam in FAMILIES:
        mod = importlib.import_module(f"llmir_core.targets.triton.kernels.{fam}")
        for s in mod.aot_specs(_PTR[dtype]):
            if (kernels is None or s.kernel in kernels) and not (one_each and s.kernel in seen):
                specs.append(s)
                seen.add(s.kernel)
    return specs


def _kernel_fn(name: str) -> Any:
    from llmir_core.targets.triton.kernels import FAMILIES

    for fam in FAMILIES:
        mod = importlib.import_module(f"llmir_core.targets.triton.kernels.{fam}")
        if name in mod.KERNELS:
            return mod.KERNELS[name]
    raise KeyError(name)


def _signature(fn: Any, spec: Any) -> dict[str, str]:
    sig: dict[str, str] = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in spec.pointers:
            sig[p.name] = "*" + spec.pointers[p.name]
        elif p.name in spec.floats:
            sig[p.name] = "fp32"
        else:
            sig[p.name] = "i32"
    return sig


def compile_kernels(specs: list[Any], archs: list[int], out_dir: str) -> list[dict[str, Any]]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    os.makedirs(out_dir, exist_ok=True)
    entries = []
    for spec in specs:
        fn = _kernel_fn(spec.kernel)
        sig = _signature(fn, spec)
        src = ASTSource(fn, signature=sig, constexprs=dict(spec.constexprs))
        key = hashlib.sha256(
            json.dumps(
                [spec.kernel, sig, spec.constexprs, spec.num_warps], sort_keys=True, default=str
            ).encode()
        ).hexdigest()[:12]
        for cc in archs:
            k = triton.compile(
                src, target=GPUTarget("cuda", cc, 32), options={"num_warps": spec.num_warps}
            )
            files = {}
            for kind in ("ptx", "cubin"):
                data = k.asm[kind]
                blob = data.encode() if isinstance(data, str) else bytes(data)
                name = f"{spec.kernel}.{key}.sm_{cc}.{kind}"
                with open(os.path.join(out_dir, name), "wb") as fh:
                    fh.write(blob)
                files[kind] = {
                    "file": name,
                    "sha256": hashlib.sha256(blob).hexdigest(),
                    "bytes": len(blob),
                }
            entries.append(
                {
                    "kernel": spec.kernel,
                    "arch": f"sm_{cc}",
                    "signature": sig,
                    "constexprs": {k2: v for k2, v in spec.constexprs.items()},
                    "num_warps": spec.num_warps,
                    "name": k.metadata.name,
                    "shared": int(getattr(k.metadata, "shared", 0)),
                    **files,
                }
            )
    return entries


def compile_in_subprocess(
    dtype: str,
    archs: list[int],
    out_dir: str,
    kernels: set[str] | None = None,
    timeout: float = 1800,
    one_each: bool = False,
) -> list[dict[str, Any]]:
    """compile_kernels in a fresh interpreter with TRITON_INTERPRET cleared."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory() as tmp:
        listing = os.path.join(tmp, "kernels.json")
        cmd = [
            sys.executable,
            "-m",
            "llmir_core.targets.triton.aot",
            "--dtype",
            dtype,
            "--arch",
            ",".join(f"sm_{c}" for c in archs),
            "-o",
            out_dir,
            "--listing",
            listing,
        ]
        if kernels is not None:
            cmd += ["--kernels", ",".join(sorted(kernels))]
        if one_each:
            cmd.append("--one-each")
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"ahead-of-time kernel compilation failed: {tail}")
        with open(listing, encoding="utf-8") as fh:
            out: list[dict[str, Any]] = json.load(fh)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmir_core.targets.triton.aot")
    ap.add_argument("--arch", default=",".join(DEFAULT_ARCHS))
    ap.add_argument("--dtype", default="f16", choices=sorted(_PTR))
    ap.add_argument("--kernels", default="")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--listing", default="")
    ap.add_argument(
        "--one-each", action="store_true", help="only the first specialization of each kernel"
    )
    a = ap.parse_args(argv)
    wanted = {k for k in a.kernels.split(",") if k} or None
    entries = compile_kernels(all_specs(a.dtype, wanted, a.one_each), parse_archs(a.arch), a.out)
    text = json.dumps(entries, indent=1)
    if a.listing:
        with open(a.listing, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
