"""The names the engine itself writes: error classes on attempts, reasons on dead letters.

The transport's own error classes (`timeout`, `connection_error`, `blocked_address`, ...) live
in `app.net.http`; these are the ones that come from the engine, not from the network.
"""

from __future__ import annotations

from sender import health

# Attempt error classes.
ERROR_WORKER_LOST = "worker_lost"  # the sweeper found the lease expired mid-attempt
ERROR_INTERNAL = "internal_error"  # an attempt crashed: a bug, logged as an error
# A delivery that cannot be sent at all: recorded as a failed attempt of its own, before any
# request, so it takes the normal retry, health and dead-letter path while the rest of its
# batch goes out.
ERROR_NO_SECRET = "no_signing_secret"  # noqa: S105 - an error class
# KURIR_SECRET_KEY lacks the key the secret was encrypted with.
ERROR_SECRET_UNDECRYPTABLE = "secret_undecryptable"  # noqa: S105 - an error class
ERROR_BAD_HEADERS = "invalid_endpoint_headers"  # stored headers are not a JSON object
ERROR_BAD_RATE_LIMIT = "invalid_rate_limit"  # stored rate_limit_per_s is below 1
ERROR_EVENT_MISSING = "event_missing"  # the delivery's event row is gone

# Dead-letter reasons.
REASON_RETRIES_EXHAUSTED = "retries_exhausted"
REASON_ENDPOINT_DISABLED = health.REASON_ENDPOINT_DISABLED
