"""The `llmir` entry point: install the signal handlers first, then load and run the CLI.

Kept apart from app.py so that a Ctrl-C (or SIGTERM) during startup, while typer and the
command modules import, already exits 130 with `interrupted` instead of a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    from llmir_cli import _signals

    _signals.install()
    from llmir_core import interrupts

    try:
        from llmir_cli.app import app

        app()
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:
        if interrupts.received() is None and exc.code != _signals.EXIT_INTERRUPTED:
            raise
    sys.exit(_signals.announce())


if __name__ == "__main__":
    main()
