"""Regenerate the support tables of docs/llm-import.md from the importers' own tables.

python scripts/gen_llm_import_docs.py          # rewrite the GENERATED section
python scripts/gen_llm_import_docs.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmir_core.frontends.support import splice, support_markdown  # noqa: E402

PAGE = ROOT / "docs" / "llm-import.md"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    args = ap.parse_args()
    page = PAGE.read_text(encoding="utf-8")
    new = splice(page, support_markdown())
    if args.check:
        if new != page:
            print(
                f"{PAGE} is out of date: run python scripts/gen_llm_import_docs.py", file=sys.stderr
            )
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
