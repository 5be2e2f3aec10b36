"""Parsing type text (`tensor<...>`, `!quant...`, `!llm.kv_cache<...>`), cached by text.

Two shape spellings are accepted:
- compact, as MLIR writes it: `tensor<?x4x4xf32>` (static dims and anonymous `?` only);
- spaced, needed for named symbolic dims: `tensor<?batch x ?seq x 576 x f32>`, where each dim is
  an integer polynomial over `?name`s (`?past+?seq`, `2*?seq`, `?b*?s`).
Symbolic dim names start with a letter other than `x` or an underscore.
"""

from __future__ import annotations

import re

from .dims import DYN, Dim, SymDim, dim_add, dim_mul, dim_sub
from .types import DTYPE_NAMES, GGUF_QUANTS, DType, ElemType, KVCacheType, QuantType, TensorType

_SPACED_SEP = re.compile(r"\s+x\s+")
_DIM_TOKEN = re.compile(r"\s*(\?[A-Za-z_]\w*|\?|\d+|[+\-*()])")
# the text of one type, as the parser's tokenizer finds it (one level of <...> nesting inside)
TYPE_PATTERN = r"tensor<[^<>]*(?:<[^<>]*>[^<>]*)*>|!llm\.kv_cache<[^<>]*>"
_KV_PREFIX = "!llm.kv_cache<"


class TypeSyntaxError(ValueError):
    """Raised with an offset (relative to the start of the type text)."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


_CACHE: dict[str, object] = {}


def parse_type_text(text: str) -> TensorType | KVCacheType:
    cached = _CACHE.get(text)
    if cached is not None:
        return cached  # type: ignore[return-value]
    if text.startswith("tensor<"):
        t: TensorType | KVCacheType = _parse_tensor(text)
    elif text.startswith("!llm.kv_cache<"):
        t = _parse_kv(text)
    else:
        raise TypeSyntaxError(f"unknown type '{text}'; expected tensor<...> or !llm.kv_cache<...>")
    if len(_CACHE) > 100_000:
        _CACHE.clear()
    _CACHE[text] = t
    return t


def _split_top(body: str) -> list[tuple[str, int]]:
    """Split on commas outside <...> and quotes; return (piece, offset)."""
    out, depth, start, quote = [], 0, 0, False
    for i, ch in enumerate(body):
        if ch == '"':
            quote = not quote
        elif quote:
            continue
        elif ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append((body[start:i], start))
            start = i + 1
    out.append((body[start:], start))
    return out


def parse_dim_expr(text: str, base: int = 0) -> Dim:  # noqa: C901 (a hand-written expression parser)
    """Parse one dim: an integer, `?`, or a polynomial over `?name`s."""
    toks: list[tuple[str, int]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        m = _DIM_TOKEN.match(stripped, pos)
        if not m:
            raise TypeSyntaxError(
                f"unexpected '{stripped[pos:].strip()[:10]}' in dimension", base + pos
            )
        toks.append((m.group(1), base + m.start(1)))
        pos = m.end()
    if not toks:
        raise TypeSyntaxError("expected a dimension", base)
    if len(toks) == 1 and toks[0][0] == "?":
        return DYN
    i = 0

    def peek() -> str | None:
        return toks[i][0] if i < len(toks) else None

    def factor() -> Dim:
        nonlocal i
        if i >= len(toks):
            raise TypeSyntaxError("dimension expression ends early", base + len(text))
        tok, off = toks[i]
        i += 1
        if tok.isdigit():
            return _dim_int(tok, off)
        if tok == "?":
            raise TypeSyntaxError("anonymous '?' cannot be part of an expression", off)
        if tok.startswith("?"):
            name = tok[1:]
            if name.startswith("x"):
                raise TypeSyntaxError(f"symbolic dim name '{name}' may not start with 'x'", off)
            return SymDim.name(name)
        if tok == "(":
            v = expr()
            if peek() != ")":
                raise TypeSyntaxError("expected ')' in dimension", base + len(text))
            i += 1
            return v
        if tok == "-":
            return dim_mul(-1, factor())
        raise TypeSyntaxError(f"unexpected '{tok}' in dimension", off)

    def term() -> Dim:
        nonlocal i
        v = factor()
        while peek() == "*":
            i += 1
            v = dim_mul(v, factor())
        return v

    def expr() -> Dim:
        nonlocal i
        v = term()
        while peek() in ("+", "-"):
            op = toks[i][0]
            i += 1
            v = dim_add(v, term()) if op == "+" else dim_sub(v, term())
        return v

    try:
        result = expr()
    except RecursionError:
        raise TypeSyntaxError("dimension expression nested too deeply", base) from None
    if i != len(toks):
        raise TypeSyntaxError(f"unexpected '{toks[i][0]}' in dimension", toks[i][1])
    if isinstance(result, int) and result < 0:
        raise TypeSyntaxError("a dimension cannot be negative", base)
    return result


def parse_elem_type(text: str, base: int = 0) -> ElemType:
    t = text.strip()
    if t in DTYPE_NAMES:
        return DTYPE_NAMES[t]
    if t.startswith("!quant."):
        preset = GGUF_QUANTS.get(t[len("!quant.") :])
        if preset is None:
            raise TypeSyntaxError(
                f"unknown quantization preset '{t}' (known: {', '.join(GGUF_QUANTS)})", base
            )
        return preset
    if t.startswith("!quant<") and t.endswith(">"):
        pieces = [p.strip() for p, _ in _split_top(t[7:-1])]
        if not pieces or "=" in pieces[0]:
            raise TypeSyntaxError("!quant<...> must start with the scheme name", base)
        kv: dict[str, str] = {}
        for p in pieces[1:]:
            if "=" not in p:
                raise TypeSyntaxError(f"expected key=value in !quant<...>, got '{p}'", base)
            k, v = (s.strip() for s in p.split("=", 1))
            kv[k] = v
        scale_name = kv.get("scale", "f16")
        if scale_name not in DTYPE_NAMES:
            raise TypeSyntaxError(f"unknown quant scale dtype '{scale_name}'", base)
        try:
            scale = DTYPE_NAMES[scale_name]
            q = QuantType(
                pieces[0],
                int(kv["bits"]),
                int(kv["block"]),
                scale,
                kv.get("zero", "none"),
                int(kv["super_block"]) if "super_block" in kv else None,
            )
        except (KeyError, ValueError) as exc:
            raise TypeSyntaxError(f"bad !quant<...> parameters: {exc}", base) from None
        if q.zero not in ("none", "int", "min"):
            raise TypeSyntaxError(f"quant zero must be none, int or min, got '{q.zero}'", base)
        if not 1 <= q.bits <= 8:
            raise TypeSyntaxError(f"quant bits must be 1 to 8, got {q.bits}", base)
        if q.block < 1 or (
            q.super_block is not None and (q.super_block < 1 or q.super_block % q.block)
        ):
            raise TypeSyntaxError("quant block must be positive (and divide super_block)", base)
        unknown = sorted(set(kv) - {"bits", "block", "scale", "zero", "super_block"})
        if unknown:
            raise TypeSyntaxError(f"unknown !quant<...> parameter '{unknown[0]}'", base)
        return q
    raise TypeSyntaxError(f"unknown element type '{t}'", base)


def _parse_tensor(text: str) -> TensorType:
    if not text.endswith(">"):
        raise TypeSyntaxError("tensor type is missing its closing '>'", len(text))
    body = text[7:-1]
    pieces = _split_top(body)
    shape_text, _ = pieces[0]
    opts: dict[str, str] = {}
    for piece, off in pieces[1:]:
        at = 7 + off + _lead(piece)
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=\s*\"([^\"]*)\"\s*", piece)
        if not m:
            raise TypeSyntaxError(
                f"expected key=\"value\" tensor option, got '{piece.strip()}'", at
            )
        if m.group(1) not in ("layout", "device", "sema"):
            raise TypeSyntaxError(
                f"unknown tensor option '{m.group(1)}' (known: layout, device, sema)", at
            )
        if m.group(1) in opts:
            raise TypeSyntaxError(f"tensor option '{m.group(1)}' given twice", at)
        opts[m.group(1)] = m.group(2)
    dims: list[Dim] = []
    if _SPACED_SEP.search(shape_text):
        start = 0
        for sep in _SPACED_SEP.finditer(shape_text):
            dims.append(
                parse_dim_expr(
                    shape_text[start : sep.start()].lstrip(), 7 + start + _lead(shape_text[start:])
                )
            )
            start = sep.end()
        elem = parse_elem_type(shape_text[start:], 7 + start + _lead(shape_text[start:]))
    else:
        s = shape_text.strip()
        lead = 7 + _lead(shape_text)
        pos = 0
        while pos < len(s) and (s[pos].isdigit() or s[pos] == "?"):
            start = pos
            if s[pos] == "?":
                pos += 1
                if pos < len(s) and (s[pos].isalpha() or s[pos] == "_") and s[pos] != "x":
                    raise TypeSyntaxError(
                        "named dims need the spaced form: tensor<?batch x 4 x f32>", lead + start
                    )
                dims.append(DYN)
            else:
                while pos < len(s) and s[pos].isdigit():
                    pos += 1
                dims.append(_dim_int(s[start:pos], lead + start))
            if pos >= len(s) or s[pos] != "x":
                raise TypeSyntaxError("expected 'x' after a dimension", lead + pos)
            pos += 1
        elem = parse_elem_type(s[pos:], lead + pos)
    return TensorType(tuple(dims), elem, opts.get("layout"), opts.get("device"), opts.get("sema"))


MAX_DIM = 2**63 - 1  # ONNX, numpy and onnxruntime keep dims in int64


def _dim_int(text: str, offset: int) -> int:
    if not text.isascii():  # str.isdigit also accepts digits such as '²' that int() refuses
        raise TypeSyntaxError(f"dimension '{text}' is not a decimal number", offset)
    value = int(text)
    if value > MAX_DIM:
        raise TypeSyntaxError(
            f"dimension {text[:30]}{'...' if len(text) > 30 else ''} is larger "
            f"than the largest int64 ({MAX_DIM})",
            offset,
        )
    return value


def _lead(s: str) -> int:
    """The number of leading whitespace characters."""
    return len(s) - len(s.lstrip())


def _parse_kv(text: str) -> KVCacheType:
    if not text.endswith(">"):
        raise TypeSyntaxError("kv_cache type is missing its closing '>'", len(text))
    base = len(_KV_PREFIX)
    body = text[base:-1]
    kv: dict[str, tuple[str, int]] = {}  # key -> (value, offset of the value)
    need = ("layers", "kv_heads", "max_len", "head_dim", "dtype")
    for piece, off in _split_top(body):
        at = base + off + _lead(piece)
        if "=" not in piece:
            raise TypeSyntaxError(f"expected key=value in kv_cache, got '{piece.strip()}'", at)
        key, value = piece.split("=", 1)
        k, v = key.strip(), value.strip()
        if k in kv:
            raise TypeSyntaxError(f"kv_cache field '{k}' given twice", at)
        if k not in need:
            raise TypeSyntaxError(f"unknown kv_cache field '{k}' (known: {', '.join(need)})", at)
        kv[k] = (v, base + off + len(key) + 1 + _lead(value))
    missing = [k for k in need if k not in kv]
    if missing:
        raise TypeSyntaxError(f"kv_cache is missing {', '.join(missing)}", len(text) - 1)
    dtype, at = kv["dtype"]
    if dtype not in DTYPE_NAMES:
        raise TypeSyntaxError(f"unknown dtype '{dtype}' in kv_cache", at)
    ints: dict[str, int] = {}
    for k in ("layers", "kv_heads", "head_dim"):
        v, at = kv[k]
        if not v.isdigit() or int(v) < 1:
            raise TypeSyntaxError(f"kv_cache {k} must be a positive integer, got '{v}'", at)
        ints[k] = int(v)
    v, at = kv["max_len"]
    max_len = parse_dim_expr(v, at)
    return KVCacheType(ints["layers"], ints["kv_heads"], max_len, ints["head_dim"], DType(dtype))
