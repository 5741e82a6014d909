"""Operational events: Kurir's own versioned event types about its endpoints, deliveries and
contracts (`endpoint.disabled`, `endpoint.recovered`, `endpoint.verification_failed`,
`delivery.exhausted`, `ordering.key_blocked`, `event_type.sunset_passed`), delivered like
any event: signed, retried, dead-lettered.

`catalog` names each type with its schema and registers them; `emit` records one where it
happens, in that transaction; `destinations` says who receives them (the reserved operator
partner's endpoints, and opted-in partners' subscribed endpoints). The intake publishes what
`emit` recorded (`app.intake.operational`).

Loop guard: an operational event never makes another about itself. A delivery of an
operational event that goes dead makes no `delivery.exhausted` and blocks no key with an
event, and an endpoint that receives only operational events (every operator endpoint) makes
no `endpoint.*` event when it fails, is disabled, recovers or fails verification.
"""

from app.operational.catalog import (  # noqa: F401 - the package's public names
    CATALOG,
    NAMES,
    VERSION,
    OperationalType,
    ensure_registered,
)
from app.operational.destinations import (  # noqa: F401
    FROM_SETTING,
    Synced,
    ensure_operator_partner,
    is_operational_only,
    operator_partner,
    sync_operator_endpoints,
)
from app.operational.emit import about_delivery, about_endpoint, emit, enqueue_publish  # noqa: F401
from app.registry.partners import OPERATOR_PARTNER_UID, is_reserved_partner  # noqa: F401
