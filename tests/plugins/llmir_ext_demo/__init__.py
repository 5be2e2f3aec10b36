"""llmir-ext-demo: a package outside llmir that extends it through entry points (the example of
docs/targets.md, "Adding a target"; tests/targets/test_plugins.py installs it).

- `ops`: the standard-extension op set `ext` (entry point `llmir.dialects`: ext =
  llmir_ext_demo.ops). Each op declares a fallback decomposition into core ops, so a runtime
  without a kernel for it runs the decomposition: `ext.swish_beta` also has a numpy
  `reference`, `ext.soft_clip` only its decomposition.
- `target`: the target `numpy-ext` (entry point `llmir.targets`: numpy-ext =
  llmir_ext_demo.target:TARGET), a tiny numpy runtime with a native kernel for
  `ext.swish_beta` (its capabilities list it, its lowering keeps it); `ext.soft_clip` it lacks,
  so its lowering replaces it by its decomposition.
"""
