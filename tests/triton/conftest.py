"""The triton tests run every kernel on the CPU through Triton's interpreter (TRITON_INTERPRET=1,
set here before any kernel module is imported); they are skipped when triton or torch is absent."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
