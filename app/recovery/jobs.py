"""The probe jobs: the scheduler's pass claims due endpoints and queues one
`kurir.endpoint.probe` job each; a worker sends it (`probe.send_probe`)."""

from __future__ import annotations

import secrets
from datetime import datetime

from app.clock import utcnow
from app.models import Endpoint
from app.queues import DEFAULT, ENDPOINT_PROBE, JobSpec, enqueue_after_commit
from app.recovery import due
from app.runtime import Runtime

# At most this many probes are queued per pass (every 30 s): a mass outage's endpoints are
# probed over a few passes, not all at once.
PROBES_PER_PASS = 100


def probe_spec(endpoint_id: str, probe_count: int, *, now: bool = False) -> JobSpec:
    """The job sending one endpoint's next probe (one id per probe: queued once; a probe
    asked for by hand gets its own)."""
    suffix = f"now-{secrets.token_hex(4)}" if now else str(probe_count + 1)
    return JobSpec(
        DEFAULT,
        ENDPOINT_PROBE,
        (endpoint_id,),
        job_id=f"probe-{endpoint_id}-{suffix}",
        timeout_s=120,
    )


def probe_due(
    runtime: Runtime, *, now: datetime | None = None, limit: int = PROBES_PER_PASS
) -> int:
    """Periodic job: claim the endpoints due a probe and queue their probe jobs."""
    now = now or utcnow()
    with runtime.db.begin() as session:
        ids = due.claim(session, now, limit, runtime.settings.probe_days)
        specs = [
            probe_spec(endpoint_id, session.get_one(Endpoint, endpoint_id).probe_count)
            for endpoint_id in ids
        ]
        enqueue_after_commit(session, runtime.redis, specs)
    return len(ids)


def run_probe_job(endpoint_id: str) -> None:
    """RQ entry point: the endpoint id in, the process Runtime for the stores."""
    from app import runtime as runtime_mod
    from app.recovery.probe import send_probe

    send_probe(runtime_mod.current(), endpoint_id)
