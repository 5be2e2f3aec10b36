"""A small GGUF (v3) header codec for tests: read a file into editable metadata and tensor infos,
change them, write it back with the same tensor bytes. Lets the bad-input tests and the fuzzer
write files the `gguf` package's writer refuses to (a U32 token list, an unaligned offset).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# value type -> struct format (8 string, 9 array handled apart)
SCALAR = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING, ARRAY, U32, I32, F32, U64, I64 = 8, 9, 4, 5, 6, 10, 11


@dataclass
class KV:
    key: str
    type: int
    value: Any  # a scalar, a str, or for arrays (elem_type, [values])


@dataclass
class TensorInfo:
    name: str
    dims: list[int]
    type: int
    offset: int


@dataclass
class GGUF:
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes  # the data section (after alignment padding)
    alignment: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    def kv(self, key: str) -> KV:
        return next(k for k in self.kvs if k.key == key)

    def set(self, key: str, type_: int, value: Any) -> None:
        for k in self.kvs:
            if k.key == key:
                k.type, k.value = type_, value
                return
        self.kvs.append(KV(key, type_, value))

    def drop(self, key: str) -> None:
        self.kvs = [k for k in self.kvs if k.key != key]


class _Rd:
    def __init__(self, b: bytes) -> None:
        self.b, self.i = b, 0

    def take(self, fmt: str) -> Any:
        v = struct.unpack_from(fmt, self.b, self.i)[0]
        self.i += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        s = self.b[self.i : self.i + n].decode("utf-8")
        self.i += n
        return s

    def value(self, t: int) -> Any:
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])


def read(path: str | Path) -> GGUF:
    b = Path(path).read_bytes()
    r = _Rd(b)
    assert b[:4] == b"GGUF"
    r.i = 4
    version, nt, nkv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(nkv):
        key = r.string()
        t = r.take("<I")
        kvs.append(KV(key, t, r.value(t)))
    tensors = []
    for _ in range(nt):
        name = r.string()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        tensors.append(TensorInfo(name, dims, r.take("<I"), r.take("<Q")))
    g = GGUF(version, kvs, tensors, b"")
    align = next((k.value for k in kvs if k.key == "general.alignment"), 32)
    g.alignment = int(align)
    start = -(-r.i // g.alignment) * g.alignment
    g.data = b[start:]
    return g


def _w_value(out: bytearray, t: int, v: Any) -> None:
    if t == STRING:
        e = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else bytes(v)
        out += struct.pack("<Q", len(e)) + e
    elif t == ARRAY:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for x in items:
            _w_value(out, et, x)
    else:
        out += struct.pack(SCALAR[t], v)


def encode(g: GGUF) -> bytes:
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", g.version, len(g.tensors), len(g.kvs))
    for k in g.kvs:
        _w_value(out, STRING, k.key)
        out += struct.pack("<I", k.type)
        _w_value(out, k.type, k.value)
    for t in g.tensors:
        _w_value(out, STRING, t.name)
        out += struct.pack("<I", len(t.dims)) + b"".join(struct.pack("<Q", d) for d in t.dims)
        out += struct.pack("<IQ", t.type, t.offset)
    out += bytes(-len(out) % g.alignment)
    return bytes(out) + g.data


def write(g: GGUF, path: str | Path) -> Path:
    Path(path).write_bytes(encode(g))
    return Path(path)
