"""llmir core: the typed SSA IR, its dialects, verifier and reference interpreter.

This package never imports typer or rich; it returns data that the CLI renders.
"""

__version__ = "0.1.0"
SPEC_VERSION = "0.1"
