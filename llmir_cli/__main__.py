"""`python -m llmir_cli`: the same as the `llmir` command."""

from llmir_cli.main import main

main()
