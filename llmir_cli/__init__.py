"""The `llmir` command line: thin commands over llmir_core."""
