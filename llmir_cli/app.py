"""Assembles the `llmir` command from the modules in llmir_cli/commands."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from llmir_core import SPEC_VERSION, __version__

# One module per subcommand; each exposes `register(app)`. A command is listed
# here only once it works end to end.
COMMAND_MODULES = [
    "llmir_cli.commands.verify",
    "llmir_cli.commands.fmt",
    "llmir_cli.commands.optimize",
    "llmir_cli.commands.init", "llmir_cli.commands.registry",
    "llmir_cli.commands.import_", "llmir_cli.commands.build", "llmir_cli.commands.run",
    "llmir_cli.commands.bench",
]

app = typer.Typer(
    name="llmir",
    help="llmir: a typed, textual IR and verified compiler toolchain for LLMs.\n\n"
    "Exit codes: 0 ok, 1 check failed, 2 usage or input error, 3 inconclusive, "
    "70 internal error, 130 interrupted.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"llmir {__version__} (IR spec {SPEC_VERSION})")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True,
                     help="Print the llmir version and exit."),
    ] = False,
) -> None:
    """llmir: a typed, textual IR and verified compiler toolchain for LLMs."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)

from llmir_cli._trace import add_trace_option  # noqa: E402  (perf: --trace FILE on every command)

add_trace_option(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
