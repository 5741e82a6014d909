"""The names the engine itself writes: error classes on attempts, reasons on dead letters.

The transport's own error classes (`timeout`, `connection_error`, `blocked_address`, ...) live
in `sender.http`; these are the ones that come from the engine, not from the network.
"""

from __future__ import annotations

from sender import health

# Attempt error classes.
ERROR_WORKER_LOST = "worker_lost"  # the sweeper found the lease expired mid-attempt
ERROR_INTERNAL = "internal_error"  # an attempt crashed: a bug, logged as an error
ERROR_NO_SECRET = "no_signing_secret"  # noqa: S105 - an error class

# Dead-letter reasons.
REASON_RETRIES_EXHAUSTED = "retries_exhausted"
REASON_ENDPOINT_DISABLED = health.REASON_ENDPOINT_DISABLED
