"""The llmir IR: object model, types, attributes, parser and printer."""

from .attrs import DenseAttr
from .core import Function, Module, Op, Value
from .dims import DYN, Dim, SymDim
from .parser import parse_file, parse_module
from .printer import print_module
from .types import DType, KVCacheType, QuantType, TensorType, Type, tensor

__all__ = [
    "DenseAttr",
    "Function",
    "Module",
    "Op",
    "Value",
    "DYN",
    "Dim",
    "SymDim",
    "parse_file",
    "parse_module",
    "print_module",
    "DType",
    "KVCacheType",
    "QuantType",
    "TensorType",
    "Type",
    "tensor",
]
