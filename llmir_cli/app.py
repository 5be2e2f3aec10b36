"""Assembles the `llmir` command from the modules in llmir_cli/commands, loading each on first use.

`COMMANDS` is the table of subcommands: name -> (module, short help). A command's module is
imported only when that command runs (or its own --help is shown), so `llmir --version`,
`llmir --help` and every command start without importing what the other commands need.

Adding a command is one entry here: `"serve": ("llmir_cli.commands.serve", "Serve a built model
over HTTP."),` where the module exposes `register(app: typer.Typer)` that adds exactly the
command (or sub-Typer) named like the entry. tests/cli/test_startup.py checks that every entry
loads, registers that name, and that its short help here matches the module's.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, get_args

import typer

# typer's `cls=` takes a subclass of TyperGroup (typer asserts it; typer >= 0.2x vendors click,
# so a click.Group does not fit), and TyperArgument is the class typer gives arguments: both are
# subclassed here, overriding only click's public Group and Parameter methods.
from typer.core import TyperArgument, TyperGroup

from llmir_core import SPEC_VERSION, __version__

# name -> (module exposing `register(app)`, the one-line help `llmir --help` lists). In the order
# `llmir --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": (
        "llmir_cli.commands.verify",
        "Check a .llmir file: syntax, SSA, ops, types, weights.",
    ),
    "fmt": ("llmir_cli.commands.fmt", "Print a .llmir file in its canonical form."),
    "optimize": ("llmir_cli.commands.optimize", "Optimize a .llmir module with a pass pipeline."),
    "init": ("llmir_cli.commands.init", "Create a project: pull, verify and pin a model."),
    "import": (
        "llmir_cli.commands.import_",
        "Import a model (ONNX, HF folder, GGUF, NAME:TAG) to .llmir.",
    ),
    "build": (
        "llmir_cli.commands.build",
        "Build a .llmir module into an artifact folder for a runtime.",
    ),
    "run": ("llmir_cli.commands.run", "Run a model: generate text, or run it on input tensors."),
    "eval": (
        "llmir_cli.commands.eval",
        "Measure perplexity on a text, and KL divergence to a reference.",
    ),
    "bench": (
        "llmir_cli.commands.bench",
        "Measure prefill and decode speed of a decoder artifact.",
    ),
    "registry": ("llmir_cli.commands.registry", "Browse the model index, or mirror it."),
    "serve": (
        "llmir_cli.commands.serve",
        "Serve a decoder artifact over an OpenAI-compatible HTTP API.",
    ),
    "tokenize": (
        "llmir_cli.commands.tokenize",
        "Tokenize text (or --decode ids) with a model's tokenizer.",
    ),
}

_LOADED: dict[str, Any] = {}  # name -> the click command built from its module (once per process)


def load_command(name: str) -> Any:
    """The click command of a COMMANDS entry, importing its module on first use."""
    if name not in _LOADED:
        module_name, short = COMMANDS[name]
        holder = typer.Typer(rich_markup_mode=None, add_completion=False)
        importlib.import_module(module_name).register(holder)
        from llmir_cli._trace import add_trace_option

        add_trace_option(holder)  # --trace FILE on every command
        cmd = _built_group(holder).commands.get(name)
        if cmd is None:
            raise RuntimeError(f"{module_name}.register() did not add the command {name!r}")
        cmd.short_help = short
        _plain_metavars(cmd)
        _LOADED[name] = cmd
    return _LOADED[name]


def _built_group(holder: typer.Typer) -> Any:
    """The click group typer builds from `holder`, through typer's public API only: typer has no
    public call that returns it, so the holder runs once with no arguments and its callback (which
    also makes it a group, whether the module added a command or a Typer) receives the group as
    `ctx.command`."""
    built: list[Any] = []

    @holder.callback(invoke_without_command=True)
    def _capture(ctx: typer.Context) -> None:
        built.append(ctx.command)

    holder(args=[], prog_name="llmir", standalone_mode=False)
    return built[0]


def _metavar(param: Any) -> str:
    """An option's value placeholder as users know them (PATH, TEXT, INTEGER, human|json), not
    typer's annotation spelling (`<list[str]>`, `<int range>`)."""
    desc = param.type_descriptor
    if desc.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices or ())
    ann = desc.annotation
    if desc.is_list:
        ann = get_args(ann)[0] if get_args(ann) else str
    if desc.is_path:
        return "PATH"
    return {int: "INTEGER", float: "NUMBER", bool: "BOOLEAN"}.get(ann, "TEXT")


class _PlainArgument(TyperArgument):
    """An argument shown as its upper-case name: `FILE` (required), `[FILE]`, `NAME...`.

    typer renders arguments as `{file}` in the usage line and `FILE <path>` in the help, and
    offers no setting for the plain form tests/cli/test_help.py requires, so the two click
    methods that render a parameter (get_usage_pieces, get_help_record) are overridden."""

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        name = self.metavar or (self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return [name + ("..." if self.nargs != 1 and not name.endswith("...") else "")]

    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        return None if record is None else (self.metavar or (self.name or "").upper(), record[1])


def _plain_metavars(cmd: Any) -> None:
    """Give every parameter of a command (and of its subcommands) a plain placeholder: an
    option's is its metavar (which typer shows in place of its type), an argument's its name."""
    for sub in getattr(cmd, "commands", {}).values():
        _plain_metavars(sub)
    for param in cmd.params:
        if param.param_type_name == "argument":
            param.__class__ = _PlainArgument
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()
        elif param.param_type_name == "option" and param.metavar is None:
            if not (getattr(param, "is_flag", False) or getattr(param, "count", False)):
                param.metavar = _metavar(param)


class LazyGroup(TyperGroup):
    """A typer group whose table commands are imported when resolved, not when listed."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            from difflib import get_close_matches

            matches = get_close_matches(name, self.list_commands(ctx))
            hint = " Did you mean " + ", ".join(map(repr, matches)) + "?" if matches else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, COMMANDS[name][1]) for name in COMMANDS]
        rows += [
            (n, c.get_short_help_str(formatter.width))
            for n, c in self.commands.items()
            if n not in COMMANDS and not c.hidden
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    name="llmir",
    cls=LazyGroup,
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
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the llmir version and exit.",
        ),
    ] = False,
) -> None:
    """llmir: a typed, textual IR and verified compiler toolchain for LLMs."""


def main() -> None:
    """The CLI with its signal handling (see llmir_cli/main.py, the entry point)."""
    from llmir_cli.main import main as entry

    entry()


if __name__ == "__main__":
    main()
