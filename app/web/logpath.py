"""What of a request's path may be written to a log.

A portal magic link carries its token in the path (`/portal/login/<token>`): a log line with
the raw path would hand whoever reads the logs a working link. Everything that logs a request
path goes through `loggable_path`.
"""

from __future__ import annotations

import re

# Paths whose last segment is a credential.
_SECRET_SEGMENT = re.compile(r"^(/portal/login/)[^/]*")
REDACTED = "[redacted]"


def loggable_path(path: str) -> str:
    """`path` with any credential it carries replaced by `[redacted]`."""
    return _SECRET_SEGMENT.sub(lambda match: match.group(1) + REDACTED, path)
