"""No file of the project keeps a merge's conflict markers (one once reached the UI's menu)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def test_no_tracked_file_has_conflict_markers():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:  # not a git checkout (an sdist): walk the sources instead
        names = [
            str(p.relative_to(ROOT))
            for folder in ("app", "sender", "dlq", "migrations", "tests", "docs", "bench")
            for p in (ROOT / folder).rglob("*")
            if p.is_file()
        ]
    else:
        names = [n for n in listed.stdout.decode().split("\0") if n]
    marked = []
    for name in names:
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if MARKER.search(text):
            marked.append(name)
    assert not marked, f"merge conflict markers in {marked}"
