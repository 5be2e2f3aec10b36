"""A hand-written recursive-descent parser for `.llmir` text.

Grammar (informal; `docs/spec.md` has the full version):

    module   := 'module' SYMBOL? ('attributes' dict)? '{' func* '}'
    func     := 'func.func' SYMBOL '(' (VALUE ':' type),* ')' ('->' types)? ('attributes' dict)?
                '{' op* 'return' (VALUE,+ ':' type,+)? '}'
    op       := (VALUE,+ '=')? OPNAME VALUE,* dict? ':' '(' type,* ')' '->' types ('loc' '(' STRING ')')?
    types    := type | '(' type,* ')'

SSA rules that the text alone decides (single definition, defined before use, operand types equal
to the definitions' types) are checked here, with the position of the offending token.
"""

from __future__ import annotations

import bisect
import json
import re
from typing import Any

import numpy as np

from llmir_core import SPEC_VERSION
from llmir_core.errors import ParseError, SourcePos

from .attrs import DenseAttr
from .core import Function, Module, Op, Value
from .dims import Dim
from .typeparse import TypeSyntaxError, parse_dim_expr, parse_elem_type, parse_type_text
from .types import DTYPE_NAMES, KVCacheType, QuantType, TensorType, Type, numpy_dtype

_TOKEN = re.compile(
    r"""(?P<ws>(?:\s+|//[^\n]*)+)
    |(?P<type>tensor<[^<>]*(?:<[^<>]*>[^<>]*)*>|!llm\.kv_cache<[^<>]*>)
    |(?P<quant>!quant(?:\.\w+|<[^<>]*>))
    |(?P<val>%[\w.$]+)
    |(?P<sym>@[\w.$]+)
    |(?P<dim>\?(?:[A-Za-z_]\w*)?)
    |(?P<num>-?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|inf\b)|nan\b)
    |(?P<str>"(?:[^"\\\n]|\\.)*")
    |(?P<id>[A-Za-z_][\w.$]*)
    |(?P<arrow>->)
    |(?P<p>[(){}\[\]<>,:=+*\-])
    |(?P<bad>.)""",
    re.X | re.S,
)
_OPNAME = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_][\w.]*")
_EOF = "eof"


class Parser:
    def __init__(self, text: str, filename: str = "<string>") -> None:
        self.text = text
        self.filename = filename
        kinds: list[str] = []
        texts: list[str] = []
        starts: list[int] = []
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind == "ws":
                continue
            kinds.append(kind)  # type: ignore[arg-type]
            texts.append(m.group())
            starts.append(m.start())
        kinds.append(_EOF)
        texts.append("")
        starts.append(len(text))
        self.kinds, self.texts, self.starts = kinds, texts, starts
        self.i = 0
        self._line_starts: list[int] | None = None

    # -- positions and errors ------------------------------------------------------------
    def pos_at(self, offset: int) -> SourcePos:
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        line = bisect.bisect_right(self._line_starts, offset)
        col = offset - self._line_starts[line - 1] + 1
        return SourcePos(self.filename, line, col)

    def line_text(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def error(self, message: str, offset: int | None = None) -> ParseError:
        off = self.starts[self.i] if offset is None else offset
        pos = self.pos_at(off)
        return ParseError(message, pos, self.line_text(pos.line))

    def _describe(self, i: int) -> str:
        if self.kinds[i] == _EOF:
            return "end of file"
        if self.kinds[i] == "bad":
            ch = self.texts[i]
            return "an unterminated string" if ch == '"' else f"unexpected character '{ch}'"
        return f"'{self.texts[i][:40]}'"

    # -- token helpers --------------------------------------------------------------------
    def peek(self, k: int = 0) -> str:
        return self.texts[min(self.i + k, len(self.texts) - 1)]

    def kind(self, k: int = 0) -> str:
        return self.kinds[min(self.i + k, len(self.kinds) - 1)]

    def take(self) -> str:
        t = self.texts[self.i]
        if self.kinds[self.i] != _EOF:
            self.i += 1
        return t

    def accept(self, text: str) -> bool:
        if self.texts[self.i] == text and self.kinds[self.i] in ("p", "id", "arrow"):
            self.i += 1
            return True
        return False

    def expect(self, text: str, what: str | None = None) -> None:
        if not self.accept(text):
            raise self.error(f"expected '{text}'{' ' + what if what else ''}, found {self._describe(self.i)}")

    def expect_kind(self, kind: str, what: str) -> str:
        if self.kinds[self.i] != kind:
            raise self.error(f"expected {what}, found {self._describe(self.i)}")
        return self.take()

    # -- module, functions -----------------------------------------------------------------
    def parse_module(self) -> Module:
        if self.kind() == _EOF:
            raise self.error("empty input: expected 'module'")
        self.expect("module", "at the start of the file")
        name = "module"
        if self.kind() == "sym":
            name = self.take()[1:]
        attrs: dict[str, Any] = {}
        if self.accept("attributes"):
            attrs = self.parse_attr_dict()
        version = attrs.get("llmir.version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise self.error(f"unsupported llmir spec version {version!r}; this llmir reads {SPEC_VERSION!r}", 0)
        self.expect("{", "to open the module body")
        functions: list[Function] = []
        seen: dict[str, SourcePos] = {}
        while not self.accept("}"):
            if self.kind() == _EOF:
                raise self.error("unexpected end of file: the module body is not closed with '}'")
            f = self.parse_function()
            if f.name in seen:
                raise ParseError(f"redefinition of function @{f.name} (first defined at {seen[f.name]})",
                                 f.pos, self.line_text(f.pos.line))  # type: ignore[arg-type]
            seen[f.name] = f.pos  # type: ignore[assignment]
            functions.append(f)
        if self.kind() != _EOF:
            raise self.error(f"expected end of file after the module, found {self._describe(self.i)}")
        return Module(name, functions, attrs, source=self.filename)

    def parse_function(self) -> Function:
        start = self.starts[self.i]
        self.expect("func.func", "(a function)")
        fname = self.expect_kind("sym", "a function name like @main")[1:]
        self.expect("(")
        scope: dict[str, Value] = {}
        args: list[Value] = []
        if not self.accept(")"):
            while True:
                off = self.starts[self.i]
                aname = self.expect_kind("val", "an argument name like %x")[1:]
                self.expect(":")
                v = Value(aname, self.parse_type(), pos=self.pos_at(off))
                if aname in scope:
                    raise self.error(f"redefinition of argument %{aname}", off)
                scope[aname] = v
                args.append(v)
                if self.accept(")"):
                    break
                self.expect(",", "or ')' in the argument list")
        sig_types: list[Type] = []
        if self.accept("->"):
            sig_types = self.parse_type_list()
        fattrs: dict[str, Any] = {}
        if self.accept("attributes"):
            fattrs = self.parse_attr_dict()
        fn = Function(fname, args, attrs=fattrs, pos=self.pos_at(start))
        self.expect("{", "to open the function body")
        while True:
            if self.kind() == _EOF:
                raise self.error(f"unexpected end of file in function @{fname}: missing 'return' and '}}'")
            if self.peek() == "return" and self.kind() == "id":
                self.parse_return(fn, scope, sig_types)
                break
            fn.ops.append(self.parse_op(scope))
        self.expect("}", "after 'return' to close the function")
        return fn

    def parse_return(self, fn: Function, scope: dict[str, Value], sig_types: list[Type]) -> None:
        ret_off = self.starts[self.i]
        self.take()
        fn.return_pos = self.pos_at(ret_off)
        outs: list[tuple[Value, int]] = []
        if self.kind() == "val":
            while True:
                off = self.starts[self.i]
                outs.append((self.lookup(scope, self.take()[1:], off), off))
                if not self.accept(","):
                    break
            self.expect(":", "and the returned types")
            types_off = self.starts[self.i]
            types = [self.parse_type()]
            while self.accept(","):
                types.append(self.parse_type())
            if len(types) != len(outs):
                raise self.error(f"return lists {len(outs)} values but {len(types)} types", types_off)
            for (v, off), t in zip(outs, types):
                if v.type != t:
                    raise self.error(f"return type {t} does not match %{v.name}'s type {v.type}", off)
        fn.outputs = [v for v, _ in outs]
        if [v.type for v in fn.outputs] != sig_types:
            got = ", ".join(str(v.type) for v in fn.outputs) or "nothing"
            want = ", ".join(str(t) for t in sig_types) or "nothing"
            raise self.error(f"function @{fn.name} returns ({got}) but its signature says ({want})", ret_off)

    def lookup(self, scope: dict[str, Value], name: str, off: int) -> Value:
        v = scope.get(name)
        if v is None:
            raise self.error(f"use of undefined value %{name}", off)
        return v

    def parse_op(self, scope: dict[str, Value]) -> Op:
        start = self.starts[self.i]
        result_names: list[tuple[str, int]] = []
        if self.kind() == "val":
            while True:
                off = self.starts[self.i]
                result_names.append((self.take()[1:], off))
                if not self.accept(","):
                    break
            self.expect("=", "after the result names")
        op_off = self.starts[self.i]
        if self.kind() != "id" or not _OPNAME.fullmatch(self.peek()):
            raise self.error(f"expected an op name like core.add, found {self._describe(self.i)}")
        opname = self.take()
        operands: list[tuple[Value, int]] = []
        if self.kind() == "val":
            while True:
                off = self.starts[self.i]
                operands.append((self.lookup(scope, self.take()[1:], off), off))
                if not self.accept(","):
                    break
        attrs: dict[str, Any] = {}
        if self.peek() == "{" and self.kind() == "p":
            attrs = self.parse_attr_dict()
        self.expect(":", f"and the type signature of {opname}")
        self.expect("(", "to open the operand types")
        in_types: list[tuple[Type, int]] = []
        if not self.accept(")"):
            while True:
                off = self.starts[self.i]
                in_types.append((self.parse_type(), off))
                if self.accept(")"):
                    break
                self.expect(",", "or ')' in the operand types")
        self.expect("->", "between operand and result types")
        out_off = self.starts[self.i]
        out_types = self.parse_type_list()
        origin = None
        if self.peek() == "loc" and self.kind() == "id":
            self.take()
            self.expect("(")
            origin = json.loads(self.expect_kind("str", "a location string"))
            self.expect(")")
        if len(in_types) != len(operands):
            raise self.error(f"{opname} has {len(operands)} operands but its signature lists "
                             f"{len(in_types)} types", op_off)
        for (v, _), (t, toff) in zip(operands, in_types):
            if v.type != t:
                raise self.error(f"operand %{v.name} has type {v.type}, but the signature says {t}", toff)
        if len(out_types) != len(result_names):
            raise self.error(f"{opname} defines {len(result_names)} results but its signature lists "
                             f"{len(out_types)} result types", out_off)
        op = Op(opname, [v for v, _ in operands], out_types, attrs,
                [n for n, _ in result_names], origin, self.pos_at(op_off))
        for r, (n, off) in zip(op.results, result_names):
            if n in scope:
                prev = scope[n]
                where = f" (first defined at {prev.pos.line}:{prev.pos.col})" if prev.pos else ""
                raise self.error(f"redefinition of value %{n}{where}", off)
            r.pos = self.pos_at(off)
            scope[n] = r
        if start != op_off:
            pass
        return op

    # -- types -----------------------------------------------------------------------------
    def parse_type(self) -> Type:
        kind = self.kind()
        off = self.starts[self.i]
        if kind == "type":
            text = self.take()
            try:
                return parse_type_text(text)
            except TypeSyntaxError as exc:
                raise self.error(str(exc), off + exc.offset) from None
        if kind == "id" and self.peek() == "tensor":
            raise self.error("malformed tensor type: expected tensor<DIMS x DTYPE> with a closing '>'")
        raise self.error(f"expected a type, found {self._describe(self.i)}")

    def parse_type_list(self) -> list[Type]:
        if self.accept("("):
            out: list[Type] = []
            if self.accept(")"):
                return out
            while True:
                out.append(self.parse_type())
                if self.accept(")"):
                    return out
                self.expect(",", "or ')' in the type list")
        return [self.parse_type()]

    # -- attributes ------------------------------------------------------------------------
    def parse_attr_dict(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        if self.accept("}"):
            return out
        while True:
            off = self.starts[self.i]
            if self.kind() == "id":
                key = self.take()
            elif self.kind() == "str":
                key = json.loads(self.take())
            else:
                raise self.error(f"expected an attribute name, found {self._describe(self.i)}")
            if key in out:
                raise self.error(f"attribute '{key}' given twice", off)
            self.expect("=", f"after attribute name '{key}'")
            out[key] = self.parse_attr_value()
            if self.accept("}"):
                return out
            self.expect(",", "or '}' between attributes")

    def _dim_expr(self) -> Dim:
        off = self.starts[self.i]
        parts: list[str] = []
        while self.kind() in ("dim", "num") or (self.kind() == "p" and self.peek() in "+-*()"):
            if self.kind() == "p" and self.peek() == ")" and parts.count("(") <= parts.count(")"):
                break
            parts.append(self.take())
        try:
            return parse_dim_expr(" ".join(parts))
        except TypeSyntaxError as exc:
            raise self.error(str(exc), off) from None

    def parse_attr_value(self) -> Any:
        kind = self.kind()
        text = self.peek()
        off = self.starts[self.i]
        if kind == "dim":
            return self._dim_expr()
        if kind == "num":
            nxt = self.peek(1)
            if self.kind(1) == "p" and nxt in "*+" or (self.kind(1) == "num" and nxt.startswith("-")):
                return self._dim_expr()
            self.take()
            if text.lstrip("-") in ("inf", "nan") or any(c in text for c in ".eE"):
                return float(text)
            return int(text)
        if kind == "str":
            return json.loads(self.take())
        if kind == "type":
            return self.parse_type()
        if kind == "quant":
            try:
                q = parse_elem_type(self.take())
            except TypeSyntaxError as exc:
                raise self.error(str(exc), off) from None
            assert isinstance(q, QuantType)
            return q
        if kind == "p" and text == "[":
            self.take()
            items: list[Any] = []
            if self.accept("]"):
                return tuple(items)
            while True:
                items.append(self.parse_attr_value())
                if self.accept("]"):
                    return tuple(items)
                self.expect(",", "or ']' in the array")
        if kind == "p" and text == "{":
            return self.parse_attr_dict()
        if kind == "id":
            if text == "true" or text == "false":
                self.take()
                return text == "true"
            if text == "none":
                self.take()
                return None
            if text in DTYPE_NAMES:
                self.take()
                return DTYPE_NAMES[text]
            if text == "dense":
                return self.parse_dense()
        raise self.error(f"expected an attribute value, found {self._describe(self.i)}")

    def parse_dense(self) -> DenseAttr:
        self.take()
        self.expect("<", "after 'dense'")
        body_off = self.starts[self.i]
        body = self._dense_literal()
        self.expect(">", "to close dense<...>")
        self.expect(":", "and the type of the dense constant")
        toff = self.starts[self.i]
        t = self.parse_type()
        if not isinstance(t, TensorType) or t.static_shape() is None or t.is_quantized:
            raise self.error("a dense constant needs a static, non-quantized tensor type", toff)
        shape = t.static_shape()
        assert shape is not None and not isinstance(t.dtype, QuantType)
        try:
            arr = np.array(body, dtype=np.float64 if t.dtype.is_float else None)
            if t.dtype.is_int and arr.dtype.kind == "f":
                raise ValueError(f"float values in an integer ({t.dtype}) constant")
            if t.dtype.value == "bool" and arr.dtype.kind not in "b":
                raise ValueError("bool constants take true/false")
            arr = arr.astype(numpy_dtype(t.dtype))
        except (ValueError, TypeError, OverflowError) as exc:
            raise self.error(f"bad dense constant: {exc}", body_off) from None
        size = int(np.prod(shape)) if shape else 1
        if arr.ndim == 0 and shape != ():
            arr = np.full(shape, arr, dtype=arr.dtype)
        elif arr.shape != shape:
            if arr.size == size and arr.shape == (0,) == shape:
                pass
            else:
                raise self.error(f"dense constant has shape {list(arr.shape)} but its type says "
                                 f"{list(shape)}", body_off)
        return DenseAttr(arr, t)

    def _dense_literal(self) -> Any:
        kind, text = self.kind(), self.peek()
        if kind == "p" and text == "[":
            self.take()
            items: list[Any] = []
            if self.accept("]"):
                return items
            while True:
                items.append(self._dense_literal())
                if self.accept("]"):
                    return items
                self.expect(",", "or ']' in the dense literal")
        if kind == "num":
            self.take()
            if text.lstrip("-") in ("inf", "nan") or any(c in text for c in ".eE"):
                return float(text)
            return int(text)
        if kind == "id" and text in ("true", "false"):
            self.take()
            return text == "true"
        raise self.error(f"expected a number in the dense literal, found {self._describe(self.i)}")


def parse_module(text: str, filename: str = "<string>") -> Module:
    """Parse `.llmir` text; raises ParseError with file:line:col on malformed input."""
    return Parser(text, filename).parse_module()


def parse_file(path: str) -> Module:
    from llmir_core.errors import InputError

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", hint="check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected a .llmir file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})",
                         hint="is this a binary model file? use `llmir import` for models") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_module(text, path)


__all__ = ["parse_module", "parse_file", "Parser", "KVCacheType"]
