"""llmir-ext-bad: plugins llmir must refuse, each with one warning line naming it and its
package while everything else keeps working (tests/targets/test_plugins.py).

- `broken`: an op set whose module fails to import (a missing dependency); the target
  entry point `broken-target` names an object `_op` does not have;
- `shadow`: an op set that registers a fine op, then one named like a built-in op (`core.silu`):
  refused, and the fine op registered before it is removed again;
- `intrude`: an op set adding an op to a built-in dialect (`llm.swish`): refused;
- `shadow_pass`: a target whose lowering pass is named like a built-in pass (`cse`): that pass
  is left out.
"""
