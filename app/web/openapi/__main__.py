"""`python -m app.web.openapi`: print the API description, or keep its committed copy current.

    python -m app.web.openapi            the document, as committed, on stdout
    python -m app.web.openapi --write    rewrite docs/openapi.json (run from the repository root)
    python -m app.web.openapi --check    exit 1 when docs/openapi.json differs from the code

The committed copy lets clients and reviewers read the API without running Kurir, and shows
every change to it as a diff; tests/unit/test_openapi_file.py fails when it drifts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.web.openapi import COMMITTED_PATH, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.web.openapi",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"rewrite {COMMITTED_PATH}")
    action.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 when {COMMITTED_PATH} is not what the code serves",
    )
    args = parser.parse_args(argv)
    text = render()
    path = Path(COMMITTED_PATH)
    if args.write:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    elif args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            print(
                f"{path} is out of date: run `python -m app.web.openapi --write`", file=sys.stderr
            )
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
