"""A hand-written recursive-descent parser for `.llmir` text.

Grammar (informal; `docs/spec.md` has the full version):

    module   := 'module' SYMBOL? ('attributes' dict)? '{' func* '}'
    func     := 'func.func' SYMBOL '(' (VALUE ':' type),* ')' ('->' types)? ('attributes' dict)?
                '{' op* 'return' (VALUE,+ ':' type,+)? '}'
    op       := (VALUE,+ '=')? OPNAME VALUE,* dict? ':' '(' type,* ')' '->' types ('loc' '(' STRING ')')?
    types    := type | '(' type,* ')'

SSA rules that the text alone decides (single definition, defined before use, operand types equal
to the definitions' types) are checked here, with the position of the offending token.

Speed: tokens are produced lazily, and an op written on one line in the printer's canonical
spelling is read by one regular expression (`_OP_LINE`) with its type lists and attribute
dictionaries cached by text. Anything the fast path does not accept exactly (other spacing, an
error of any kind) is re-read from the same offset by the token-level parser, which produces the
diagnostics: the fast path only ever returns what the slow path would.
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
from .core import Function, Module, Op, Value, gc_paused
from .dims import Dim, SymDim, _Dyn
from .typeparse import (
    TYPE_PATTERN,
    TypeSyntaxError,
    parse_dim_expr,
    parse_elem_type,
    parse_type_text,
)
from .types import DTYPE_NAMES, DType, KVCacheType, QuantType, TensorType, Type, numpy_dtype

_STR = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'  # a JSON string on one line (unrolled: fast)
_TOKEN = re.compile(
    r"(?>(?:\s+|//[^\n]*)*)"  # whitespace and comments before the token (atomic: linear)
    rf"""(?:(?P<type>{TYPE_PATTERN})
    |(?P<quant>!quant(?:\.\w+|<[^<>]*>))
    |(?P<val>%[\w.$]+)
    |(?P<sym>@(?:[\w.$]+|{_STR}))
    |(?P<dim>\?(?:[A-Za-z_]\w*)?)
    |(?P<num>-?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|inf\b)|nan\b)
    |(?P<str>{_STR})
    |(?P<id>[A-Za-z_][\w.$]*)
    |(?P<arrow>->)
    |(?P<p>[(){{}}\[\]<>,:=+*\-])
    |(?P<bad>.)
    |(?P<eof>\Z))""",
    re.X | re.S,
)
_OPNAME = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_][\w.]*")
_EOF = "eof"
_NAMES = r"%[\w.$]+(?:, %[\w.$]+)*"
_TYPES = rf"(?:{TYPE_PATTERN})(?:, (?:{TYPE_PATTERN}))*"
# one op in the printer's spelling, on one line (the fast path; see the module docstring)
_OP_LINE = re.compile(
    r"(?>(?:\s+|//[^\n]*)*)"  # whitespace and comment lines before the op (atomic: linear)
    rf"(?P<line>(?:(?P<res>{_NAMES}) = )?(?P<op>[A-Za-z_]\w*\.[A-Za-z_][\w.]*)(?: (?P<args>{_NAMES}))?"
    rf"(?P<attrs> \{{[^{{}}\n]*\}})? : \((?P<ins>{_TYPES})?\) -> "  # nested dicts: token parser
    rf"(?P<outs>{TYPE_PATTERN}|\((?:{_TYPES})?\))(?: loc\((?P<loc>{_STR})\))?)[ \t]*\r?(?=\n|\Z)"
    # without a loc on the line, a `loc(...)` on a later line still belongs to this op
    r"(?(loc)|(?!(?>(?:\s+|//[^\n]*)*)loc(?![\w.$])))"
)
_TYPE_ITEM = re.compile(TYPE_PATTERN)
_TYPES_CACHE: dict[str, list[Type]] = {}
_ATTRS_CACHE: dict[str, dict[str, Any]] = {}
_CACHE_LIMIT = 50_000
MAX_NESTING = 64  # arrays, dictionaries and dense literals nested deeper than this are refused
_IMMUTABLE = (int, float, str, DType, SymDim, _Dyn, TensorType, KVCacheType, QuantType, type(None))

Token = tuple[str, str, int, int]  # kind, text, start, end


def _immutable(v: Any) -> bool:
    if isinstance(v, tuple):
        return all(_immutable(x) for x in v)
    return isinstance(v, _IMMUTABLE)


class Parser:
    def __init__(self, text: str, filename: str = "<string>", fast: bool = True) -> None:
        self.text = text
        self.filename = filename
        self.fast = fast
        self._buf: list[Token] = []  # lookahead tokens
        self._pos = 0  # text offset after the last buffered token
        self._last_end = 0  # end offset of the last token taken
        self._line_starts: list[int] | None = None
        self._lines: list[str] | None = None
        self._depth = 0
        self._fast_off, self._fast_line = 0, 1  # the fast path's line count at an offset

    # -- positions and errors ------------------------------------------------------------
    def pos_at(self, offset: int) -> SourcePos:
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        line = bisect.bisect_right(self._line_starts, offset)
        col = offset - self._line_starts[line - 1] + 1
        return SourcePos(self.filename, line, col)

    def line_text(self, line: int) -> str:
        # split on "\n" only, as pos_at counts lines (str.splitlines also splits on \x0c, \u2028...)
        if self._lines is None:
            self._lines = self.text.split("\n")
        lines = self._lines
        return lines[line - 1].rstrip("\r") if 0 < line <= len(lines) else ""

    def error(self, message: str, offset: int | None = None) -> ParseError:
        off = self.offset() if offset is None else offset
        pos = self.pos_at(off)
        return ParseError(message, pos, self.line_text(pos.line))

    def _describe(self, tok: Token) -> str:
        kind, text = tok[0], tok[1]
        if kind == _EOF:
            return "end of file"
        if kind == "bad":
            return "an unterminated string" if text == '"' else f"unexpected character {text!r}"
        return f"'{text[:40]}'"

    # -- token helpers --------------------------------------------------------------------
    def _scan(self) -> None:
        m = _TOKEN.match(self.text, self._pos)
        assert m is not None  # `bad` matches any character, `eof` the end
        kind = m.lastgroup
        assert kind is not None
        self._pos = m.end()
        self._buf.append((kind, m.group(kind), m.start(kind), self._pos))

    def tok(self, k: int = 0) -> Token:
        buf = self._buf
        while len(buf) <= k:
            self._scan()
        return buf[k]

    def peek(self, k: int = 0) -> str:
        return self.tok(k)[1]

    def kind(self, k: int = 0) -> str:
        return self.tok(k)[0]

    def offset(self) -> int:
        return self.tok(0)[2]

    def take(self) -> str:
        t = self.tok(0)
        if t[0] != _EOF:
            del self._buf[0]
            self._last_end = t[3]
        return t[1]

    def reset(self, offset: int) -> None:
        """Continue tokenizing from a text offset (forgets the lookahead)."""
        self._buf.clear()
        self._pos = offset

    def accept(self, text: str) -> bool:
        t = self.tok(0)
        if t[1] == text and t[0] in ("p", "id", "arrow"):
            self.take()
            return True
        return False

    def expect(self, text: str, what: str | None = None) -> None:
        if not self.accept(text):
            raise self.error(
                f"expected '{text}'{' ' + what if what else ''}, found {self._describe(self.tok())}"
            )

    def expect_kind(self, kind: str, what: str) -> str:
        if self.kind() != kind:
            raise self.error(f"expected {what}, found {self._describe(self.tok())}")
        return self.take()

    def string(self, text: str, offset: int) -> str:
        """The value of a string token (JSON escapes)."""
        if "\\" not in text:
            return text[1:-1]
        try:
            value = json.loads(text, strict=False)
        except json.JSONDecodeError as exc:  # point at the backslash that starts the bad escape
            at = text.rfind("\\", 0, exc.pos + 1)
            raise self.error(f"bad escape in string: {exc.msg}", offset + max(at, 0)) from None
        assert isinstance(value, str)
        if _has_surrogate(value):  # "\ud800" alone: no UTF-8 spelling, so nothing could write it
            raise self.error(
                "bad escape in string: a lone UTF-16 surrogate (\\ud800-\\udfff "
                "must come in high-low pairs)",
                offset + _lone_surrogate_at(text),
            )
        return value

    def symbol(self) -> str:
        off = self.offset()
        text = self.take()[1:]
        return self.string(text, off + 1) if text.startswith('"') else text

    # -- module, functions -----------------------------------------------------------------
    def parse_module(self) -> Module:
        try:
            with gc_paused():
                return self._parse_module()
        except RecursionError:  # a last resort: nesting limits below should catch it first
            raise self.error("input nested too deeply") from None

    def _parse_module(self) -> Module:
        if self.kind() == _EOF:
            raise self.error("empty input: expected 'module'")
        self.expect("module", "at the start of the file")
        name = "module"
        if self.kind() == "sym":
            name = self.symbol()
        attrs: dict[str, Any] = {}
        attrs_off = self.offset()
        if self.accept("attributes"):
            attrs_off = self.offset()
            attrs = self.parse_attr_dict()
        version = attrs.get("llmir.version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise self.error(
                f"unsupported llmir spec version {version!r}; this llmir reads {SPEC_VERSION!r}",
                attrs_off,
            )
        self.expect("{", "to open the module body")
        functions: list[Function] = []
        seen: dict[str, SourcePos] = {}
        while not self.accept("}"):
            if self.kind() == _EOF:
                raise self.error("unexpected end of file: the module body is not closed with '}'")
            f = self.parse_function()
            assert f.pos is not None
            if f.name in seen:
                raise ParseError(
                    f"redefinition of function @{f.name} (first defined at "
                    f"{seen[f.name].line}:{seen[f.name].col})",
                    f.pos,
                    self.line_text(f.pos.line),
                )
            seen[f.name] = f.pos
            functions.append(f)
        if self.kind() != _EOF:
            raise self.error(
                f"expected end of file after the module, found {self._describe(self.tok())}"
            )
        return Module(name, functions, attrs, source=self.filename)

    def parse_function(self) -> Function:
        start = self.offset()
        self.expect("func.func", "(a function)")
        if self.kind() != "sym":
            raise self.error(
                f"expected a function name like @main, found {self._describe(self.tok())}"
            )
        fname = self.symbol()
        self.expect("(")
        scope: dict[str, Value] = {}
        args: list[Value] = []
        if not self.accept(")"):
            while True:
                off = self.offset()
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
        ops = fn.ops
        while True:
            if self.fast and not self._buf:
                op = self._parse_op_line(scope)
                if op is not None:
                    ops.append(op)
                    continue
            kind, text = self.tok(0)[:2]
            if kind == _EOF:
                raise self.error(
                    f"unexpected end of file in function @{fname}: missing 'return' and '}}'"
                )
            if kind == "id" and text == "return":
                self.parse_return(fn, scope, sig_types)
                break
            ops.append(self.parse_op(scope))
        self.expect("}", "after 'return' to close the function")
        return fn

    def parse_return(self, fn: Function, scope: dict[str, Value], sig_types: list[Type]) -> None:
        ret_off = self.offset()
        self.take()
        fn.return_pos = self.pos_at(ret_off)
        outs: list[tuple[Value, int]] = []
        if self.kind() == "val":
            while True:
                off = self.offset()
                outs.append((self.lookup(scope, self.take()[1:], off), off))
                if not self.accept(","):
                    break
            self.expect(":", "and the returned types")
            types_off = self.offset()
            types = [self.parse_type()]
            while self.accept(","):
                types.append(self.parse_type())
            if len(types) != len(outs):
                raise self.error(
                    f"return lists {len(outs)} values but {len(types)} types", types_off
                )
            for (v, off), t in zip(outs, types):
                if v.type != t:
                    raise self.error(
                        f"return type {t} does not match %{v.name}'s type {v.type}", off
                    )
        fn.outputs = [v for v, _ in outs]
        if [v.type for v in fn.outputs] != sig_types:
            got = ", ".join(str(v.type) for v in fn.outputs) or "nothing"
            want = ", ".join(str(t) for t in sig_types) or "nothing"
            raise self.error(
                f"function @{fn.name} returns ({got}) but its signature says ({want})", ret_off
            )

    def lookup(self, scope: dict[str, Value], name: str, off: int) -> Value:
        v = scope.get(name)
        if v is None:
            raise self.error(f"use of undefined value %{name}", off)
        return v

    # -- ops -------------------------------------------------------------------------------
    def parse_op(self, scope: dict[str, Value]) -> Op:
        if self.fast:
            self.reset(self.offset())
            op = self._parse_op_line(scope)
            if op is not None:
                return op
        return self._parse_op_tokens(scope)

    def _types_text(self, text: str | None) -> list[Type] | None:
        """A cached `T, T, ...` list from the fast path; None when it does not parse exactly."""
        if not text:
            return []
        types = _TYPES_CACHE.get(text)
        if types is not None:
            return types
        items = _TYPE_ITEM.findall(text)
        if ", ".join(items) != text:
            return None
        try:
            types = [parse_type_text(t) for t in items]
        except TypeSyntaxError:
            return None
        if len(_TYPES_CACHE) > _CACHE_LIMIT:
            _TYPES_CACHE.clear()
        _TYPES_CACHE[text] = types
        return types

    def _parse_op_line(self, scope: dict[str, Value]) -> Op | None:
        # groups of _OP_LINE by number (faster than by name): 1 line, 2 res, 3 op, 4 args,
        # 5 attrs, 6 ins, 7 outs, 8 loc
        """The fast path: one canonical op line at the current offset, or None (nothing consumed)."""
        saved = self._pos
        m = _OP_LINE.match(self.text, saved)
        if m is None:
            return None
        op = self._op_from_line(m, scope)
        if op is None:
            self.reset(saved)
        return op

    def _op_from_line(self, m: re.Match[str], scope: dict[str, Value]) -> Op | None:  # noqa: C901 (the parser's hot path, kept in one function for speed)
        # long: the parser's hot path (once per op line of a large module), one function for speed
        start = m.start(1)
        _, res, opname, args, attrs_text, ins, outs, loc = m.groups()  # see _OP_LINE's groups
        if args:
            try:
                operands = [scope[n[1:]] for n in args.split(", ")]
            except KeyError:
                return None
        else:
            operands = []
        in_types = _TYPES_CACHE.get(ins) if ins else []
        if in_types is None:
            in_types = self._types_text(ins)
        if outs[0] == "(":
            outs = outs[1:-1]
        out_types = _TYPES_CACHE.get(outs) if outs else []
        if out_types is None:
            out_types = self._types_text(outs)
        names = [n[1:] for n in res.split(", ")] if res else []
        if (
            in_types is None
            or out_types is None
            or len(in_types) != len(operands)
            or len(out_types) != len(names)
        ):
            return None
        for v, t in zip(operands, in_types):
            if v.type is not t and v.type != t:
                return None
        for n in names:
            if n in scope:
                return None
        attrs: dict[str, Any] = {}
        if attrs_text:
            cached = _ATTRS_CACHE.get(attrs_text)
            if cached is not None:
                attrs = cached  # Op copies it
            else:
                self.reset(m.start("attrs") + 1)
                try:
                    attrs = self.parse_attr_dict()
                except ParseError:
                    self._depth = 0  # ops start at depth 0; the token parser re-reads this one
                    return None
                if self._last_end != m.end("attrs"):
                    return None
                if all(_immutable(v) for v in attrs.values()):
                    if len(_ATTRS_CACHE) > _CACHE_LIMIT:
                        _ATTRS_CACHE.clear()
                    _ATTRS_CACHE[attrs_text] = attrs  # never mutated: every Op copies it
        origin = None
        if loc is not None:
            if "\\" in loc:
                try:
                    origin = json.loads(loc, strict=False)
                except ValueError:
                    return None
                if _has_surrogate(origin):
                    return None
            else:
                origin = loc[1:-1]
        # positions without a bisect per op: ops come in text order, so count lines forward
        text, filename = self.text, self.filename
        line = self._fast_line + text.count("\n", self._fast_off, start)
        self._fast_off, self._fast_line = start, line
        col = start - text.rfind("\n", 0, start)
        op = Op(
            opname,
            operands,
            out_types,
            attrs,
            names,
            origin,
            SourcePos(filename, line, col + m.start(3) - start),
        )
        for r in op.results:
            r.pos = SourcePos(filename, line, col)
            scope[r.name] = r
            col += len(r.name) + 3
        self.reset(m.end())
        return op

    def _parse_op_tokens(self, scope: dict[str, Value]) -> Op:
        result_names: list[tuple[str, int]] = []
        if self.kind() == "val":
            while True:
                off = self.offset()
                result_names.append((self.take()[1:], off))
                if not self.accept(","):
                    break
            self.expect("=", "after the result names")
        op_off = self.offset()
        if self.kind() != "id" or not _OPNAME.fullmatch(self.peek()):
            raise self.error(
                f"expected an op name like core.add, found {self._describe(self.tok())}"
            )
        opname = self.take()
        operands: list[tuple[Value, int]] = []
        if self.kind() == "val":
            while True:
                off = self.offset()
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
                off = self.offset()
                in_types.append((self.parse_type(), off))
                if self.accept(")"):
                    break
                self.expect(",", "or ')' in the operand types")
        self.expect("->", "between operand and result types")
        out_off = self.offset()
        out_types = self.parse_type_list()
        origin = None
        if self.peek() == "loc" and self.kind() == "id":
            self.take()
            self.expect("(")
            off = self.offset()
            origin = self.string(self.expect_kind("str", "a location string"), off)
            self.expect(")")
        if len(in_types) != len(operands):
            raise self.error(
                f"{opname} has {len(operands)} operands but its signature lists "
                f"{len(in_types)} types",
                op_off,
            )
        for (v, _), (t, toff) in zip(operands, in_types):
            if v.type != t:
                raise self.error(
                    f"operand %{v.name} has type {v.type}, but the signature says {t}", toff
                )
        if len(out_types) != len(result_names):
            raise self.error(
                f"{opname} defines {len(result_names)} results but its signature lists "
                f"{len(out_types)} result types",
                out_off,
            )
        op = Op(
            opname,
            [v for v, _ in operands],
            out_types,
            attrs,
            [n for n, _ in result_names],
            origin,
            self.pos_at(op_off),
        )
        for r, (n, off) in zip(op.results, result_names):
            if n in scope:
                prev = scope[n]
                where = f" (first defined at {prev.pos.line}:{prev.pos.col})" if prev.pos else ""
                raise self.error(f"redefinition of value %{n}{where}", off)
            r.pos = self.pos_at(off)
            scope[n] = r
        return op

    # -- types -----------------------------------------------------------------------------
    def parse_type(self) -> Type:
        kind = self.kind()
        off = self.offset()
        if kind == "type":
            text = self.take()
            try:
                return parse_type_text(text)
            except TypeSyntaxError as exc:
                raise self.error(str(exc), off + exc.offset) from None
        if kind == "id" and self.peek() == "tensor":
            raise self.error(
                "malformed tensor type: expected tensor<DIMS x DTYPE> with a closing '>'"
            )
        raise self.error(f"expected a type, found {self._describe(self.tok())}")

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
    def _nest(self) -> None:
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise self.error(f"attribute nesting deeper than {MAX_NESTING} levels")

    def parse_attr_dict(self) -> dict[str, Any]:
        self.expect("{")
        self._nest()
        out: dict[str, Any] = {}
        if self.accept("}"):
            self._depth -= 1
            return out
        while True:
            off = self.offset()
            kind = self.kind()
            if kind == "id":
                key = self.take()
            elif kind == "str":
                key = self.string(self.take(), off)
            else:
                raise self.error(f"expected an attribute name, found {self._describe(self.tok())}")
            if key in out:
                raise self.error(f"attribute '{key}' given twice", off)
            self.expect("=", f"after attribute name '{key}'")
            out[key] = self.parse_attr_value()
            if self.accept("}"):
                self._depth -= 1
                return out
            self.expect(",", "or '}' between attributes")

    def _dim_expr(self) -> Dim:
        off = self.offset()
        parts: list[str] = []
        depth = 0
        while True:
            kind, text = self.tok(0)[:2]
            if kind not in ("dim", "num") and not (kind == "p" and text in "+-*()"):
                break
            if text == ")":
                if depth == 0:
                    break
                depth -= 1
            elif text == "(":
                depth += 1
            parts.append(self.take())
        try:
            return parse_dim_expr(" ".join(parts))
        except TypeSyntaxError as exc:
            raise self.error(str(exc), off) from None

    def parse_attr_value(self) -> Any:
        kind, text, off = self.tok(0)[:3]
        if kind == "dim":
            return self._dim_expr()
        if kind == "num":
            nk, nxt = self.tok(1)[:2]
            if nk == "p" and nxt in ("*", "+", "-") or (nk == "num" and nxt.startswith("-")):
                return self._dim_expr()
            self.take()
            if text.lstrip("-") in ("inf", "nan") or any(c in text for c in ".eE"):
                return float(text)
            return int(text)
        if kind == "p" and text in ("-", "(") and self.kind(1) in ("dim", "num", "p"):
            return self._dim_expr()  # a symbolic dim such as -?a+4 (the printer's spelling)
        if kind == "str":
            return self.string(self.take(), off)
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
            self._nest()
            items: list[Any] = []
            if not self.accept("]"):
                while True:
                    items.append(self.parse_attr_value())
                    if self.accept("]"):
                        break
                    self.expect(",", "or ']' in the array")
            self._depth -= 1
            return tuple(items)
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
        raise self.error(f"expected an attribute value, found {self._describe(self.tok())}")

    def parse_dense(self) -> DenseAttr:
        self.take()
        self.expect("<", "after 'dense'")
        body_off = self.offset()
        body = self._dense_literal()
        self.expect(">", "to close dense<...>")
        self.expect(":", "and the type of the dense constant")
        toff = self.offset()
        t = self.parse_type()
        if not isinstance(t, TensorType) or t.static_shape() is None or t.is_quantized:
            raise self.error("a dense constant needs a static, non-quantized tensor type", toff)
        shape = t.static_shape()
        assert shape is not None and isinstance(t.dtype, DType)
        try:
            arr = _dense_array(body, t.dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise self.error(f"bad dense constant: {exc}", body_off) from None
        size = int(np.prod(shape)) if shape else 1
        if arr.ndim == 0 and shape != ():
            arr = np.full(shape, arr, dtype=arr.dtype)
        elif arr.shape != shape:
            if not (arr.size == 0 == size):  # `[]` is the literal of every empty shape
                raise self.error(
                    f"dense constant has shape {list(arr.shape)} but its type says {list(shape)}",
                    body_off,
                )
            arr = arr.reshape(shape)
        return DenseAttr(arr, t)

    def _dense_literal(self) -> Any:
        kind, text = self.tok(0)[:2]
        if kind == "p" and text == "[":
            self.take()
            self._nest()
            items: list[Any] = []
            if not self.accept("]"):
                while True:
                    items.append(self._dense_literal())
                    if self.accept("]"):
                        break
                    self.expect(",", "or ']' in the dense literal")
            self._depth -= 1
            return items
        if kind == "num":
            self.take()
            if text.lstrip("-") in ("inf", "nan") or any(c in text for c in ".eE"):
                return float(text)
            return int(text)
        if kind == "id" and text in ("true", "false"):
            self.take()
            return text == "true"
        raise self.error(
            f"expected a number in the dense literal, found {self._describe(self.tok())}"
        )


def _dense_array(body: Any, dtype: DType) -> np.ndarray:
    """The array a dense literal denotes; ValueError when its values do not fit `dtype`."""
    target = numpy_dtype(dtype)
    if dtype.is_float:
        arr = np.array(body, dtype=np.float64)
        if arr.dtype.kind != "f":
            raise ValueError(f"non-numeric values in a {dtype} constant")
        return arr.astype(target)
    arr = np.array(body, dtype=object if dtype.is_int else None)
    if dtype == DType.bool:
        if arr.dtype.kind != "b" and arr.size:
            raise ValueError("bool constants take true/false")
        return arr.astype(np.bool_)
    flat = arr.reshape(-1)
    if any(isinstance(x, list) for x in flat):
        raise ValueError("rows of different lengths")
    if any(isinstance(x, (float, bool)) or not isinstance(x, int) for x in flat):
        raise ValueError(f"{dtype} constants take integers")
    if flat.size:
        import ml_dtypes  # iinfo for int4/uint4 as well as the numpy ints

        info = ml_dtypes.iinfo(target)  # type: ignore[no-untyped-call]
        lo, hi = min(flat), max(flat)
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise ValueError(f"{bad} is out of range for {dtype} ({info.min}..{info.max})")
    return arr.astype(np.int64).astype(target) if flat.size else np.zeros(arr.shape, target)


def parse_module(text: str, filename: str = "<string>") -> Module:
    """Parse `.llmir` text; raises ParseError with file:line:col on malformed input."""
    return Parser(text, filename).parse_module()


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.S)


def _lone_surrogate_at(text: str) -> int:
    """Offset in a string token of the first \\uXXXX surrogate escape that is not half of a
    high-low pair (0 when none is found)."""
    escapes = [
        (m.start(), int(m.group(1), 16) if m.group(1) else -1, m.end())
        for m in _ESCAPE.finditer(text)
    ]
    i = 0
    while i < len(escapes):
        at, code, end = escapes[i]
        if (
            0xD800 <= code <= 0xDBFF
            and i + 1 < len(escapes)
            and escapes[i + 1][0] == end
            and 0xDC00 <= escapes[i + 1][1] <= 0xDFFF
        ):
            i += 2
            continue
        if 0xD800 <= code <= 0xDFFF:
            return at
        i += 1
    return 0


def _has_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _not_utf8(path: str, data: bytes, at: int) -> ParseError:
    """A located error for the first byte that is not UTF-8 (line and column in characters)."""
    line_start = data.rfind(b"\n", 0, at) + 1
    line_end = data.find(b"\n", at)
    shown = data[line_start : line_end if line_end >= 0 else len(data)].decode("utf-8", "replace")
    col = len(data[line_start:at].decode("utf-8", "replace")) + 1
    err = ParseError(
        f"not UTF-8 text (byte {data[at]:#04x} at offset {at})",
        SourcePos(path, data.count(b"\n", 0, at) + 1, col),
        shown,
    )
    err.hint = "is this a binary model file? use `llmir import` for models"
    return err


def parse_file(path: str) -> Module:
    from llmir_core.errors import InputError

    try:
        with open(path, "rb") as fb:
            data = fb.read()
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", hint="check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected a .llmir file") from None
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, data, exc.start) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_module(text, path)


__all__ = ["parse_module", "parse_file", "Parser", "KVCacheType", "MAX_NESTING"]
