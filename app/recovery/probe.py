"""One `kurir.endpoint.probe`: signed like any delivery, sent, and recorded in the endpoint's
probe history.

The body is an envelope like every event's (`type: "kurir.endpoint.probe"`) and the headers
are the Standard Webhooks ones, signed with the endpoint's current keys and its own
headers, so a receiver that verifies deliveries verifies a probe the same way. The
`webhook-id` is the probe's own id. Nothing here is a delivery: no event, delivery, attempt
or dead letter is written and the health counters do not move.

No transaction is held while the request is in flight: the endpoint is read, the probe is
sent, then the result is recorded under the endpoint's row lock, after checking that the
endpoint is still one Kurir probes (an operator may have enabled or disabled it meanwhile).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from app.clock import isoformat, utcnow
from app.ids import new_id
from app.models import Endpoint, EndpointProbe, Partner
from app.net.guard import policy_from
from app.net.http import Transport
from app.recovery import recover
from app.recovery.due import is_probed
from app.recovery.schedule import next_probe_at
from app.runtime import Runtime
from sender.deliver import AttemptResult, Target, attempt
from sender.engine.targets import TargetReader

log = logging.getLogger(__name__)

PROBE_EVENT = "kurir.endpoint.probe"
MESSAGE = (
    "Kurir disabled this endpoint after repeated failures and is checking whether it answers "
    "again. A 2xx answer may re-enable it."
)


@dataclass(frozen=True)
class Sent:
    """What one probe found: its stored row, and the resend job replaying what was parked
    when it re-enabled the endpoint."""

    probe: EndpointProbe
    recovered: bool
    replay_id: str | None = None


def body_of(probe_id: str, endpoint: Endpoint, partner_uid: str, n: int, now: datetime) -> bytes:
    """The probe's body: an event envelope Kurir owns."""
    envelope = {
        "id": probe_id,
        "type": PROBE_EVENT,
        "version": 1,
        "occurred_at": isoformat(now),
        "partner": partner_uid,
        "resource": None,
        "correlation_id": None,
        "data": {
            "message": MESSAGE,
            "endpoint": endpoint.id,
            "probe": n,
            "disabled_at": isoformat(endpoint.disabled_at),
        },
    }
    return json.dumps(envelope, separators=(",", ":")).encode()


def send_probe(
    runtime: Runtime,
    endpoint_id: str,
    *,
    now: datetime | None = None,
    transport: Transport | None = None,
) -> Sent | None:
    """Probe one endpoint now and record it; None when it is not (or no longer) probed.

    A 2xx re-enables an endpoint with `auto_recover` (and `KURIR_AUTO_RECOVER` on) through
    `recover.endpoint_recovered`; otherwise the next probe is scheduled, or none when the
    window of `KURIR_PROBE_DAYS` has passed.
    """
    settings = runtime.settings
    now = now or utcnow()
    probe_id = new_id("prb")
    with runtime.db.begin() as session:
        endpoint = session.get(Endpoint, endpoint_id)
        if endpoint is None or not is_probed(endpoint):
            return None
        uid = session.get_one(Partner, endpoint.partner_id).uid
        n = endpoint.probe_count + 1
        body = body_of(probe_id, endpoint, uid, n, now)
        reader = TargetReader(lambda: runtime.secret_box, settings.default_timeout_s)
        targets, unsendable = reader.read(session, {endpoint_id}, now)
    target: Target | None = targets.get(endpoint_id)
    result: AttemptResult | None = None
    error: str | None = None
    if target is None or endpoint_id in unsendable:
        why = unsendable.get(endpoint_id)
        error = why.error if why is not None else "endpoint_gone"
    elif transport is not None:
        result = _send(transport, target, probe_id, body, runtime)
    else:
        with Transport(pool_maxsize=1, max_sessions=1, resolver_threads=1) as own:
            result = _send(own, target, probe_id, body, runtime)
    with runtime.db.begin() as session:
        return record(session, runtime, endpoint_id, probe_id, now, result, error)


def _send(
    transport: Transport, target: Target, probe_id: str, body: bytes, runtime: Runtime
) -> AttemptResult:
    return attempt(
        transport,
        target,
        probe_id,
        body,
        policy_from(runtime.settings),
        connect_timeout_s=runtime.settings.connect_timeout_s,
    )


def record(
    session: Session,
    runtime: Runtime,
    endpoint_id: str,
    probe_id: str,
    now: datetime,
    result: AttemptResult | None,
    error: str | None,
) -> Sent | None:
    """Store the probe and act on it, under the endpoint's row lock."""
    endpoint = session.get(Endpoint, endpoint_id, with_for_update=True, populate_existing=True)
    if endpoint is None or not is_probed(endpoint):
        return None  # enabled, disabled by someone or deleted while the probe was out
    ok = result is not None and result.ok
    endpoint.probe_count += 1
    row = EndpointProbe(
        id=probe_id,
        endpoint_id=endpoint_id,
        at=now,
        n=endpoint.probe_count,
        status_code=result.status if result is not None else None,
        error=(error or (result.error if result is not None else None) or None),
        duration_ms=result.duration_ms if result is not None else 0,
        ok=ok,
        recovered=False,
    )
    if row.error:
        row.error = row.error[:200]
    session.add(row)
    log.info(
        "endpoint probed",
        extra={"endpoint_id": endpoint_id, "probe": row.n, "ok": ok, "status": row.status_code},
    )
    if ok and endpoint.auto_recover and runtime.settings.auto_recover:
        row.recovered = True
        session.flush()
        job = recover.endpoint_recovered(
            session, endpoint, now=now, redis=runtime.redis, probe_id=probe_id
        )
        return Sent(row, True, job.id if job is not None else None)
    disabled_at = endpoint.disabled_at or now
    endpoint.probe_next_at = next_probe_at(
        disabled_at, endpoint.probe_count, now, runtime.settings.probe_days
    )
    session.flush()
    return Sent(row, False)
