"""A plugin whose module fails to import: it needs a package that is not installed."""

from __future__ import annotations

import llmir_ext_missing_dependency  # noqa: F401  (the point: not installed)
