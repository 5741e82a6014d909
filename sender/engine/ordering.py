"""The wake of ordered delivery: once a delivery of an ordered key is recorded as released
(succeeded, or dead and let go), the next one of its key is claimed at once.

The gate itself is in the claim (`sender.ordering.ready`): whatever wakes a delivery, it is
not attempted before the one ahead of it is released. This stage only makes the wait short.
It reads after the recorder's transaction has committed, so a successor published meanwhile
is either seen here or, committed later, finds its predecessor released when its own job
claims it: no wake is lost between the two. When the read fails, the sweeper wakes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from app.db import Database
from sender import ordering
from sender.engine.work import Outcome, Release

log = logging.getLogger(__name__)

Wake = Callable[[list[tuple[str, datetime]], datetime], None]


class Sequencer:
    """Hands the engine the deliveries whose predecessor a flushed batch released."""

    def __init__(
        self, db: Callable[[], Database], wake: Wake, clock: Callable[[], datetime]
    ) -> None:
        self.db = db
        self.wake = wake
        self.clock = clock

    def after_flush(self, batch: Sequence[Outcome | Release]) -> None:
        """Called by the recorder after each committed batch; a no-op without ordered work."""
        ids = [
            item.work.delivery_id
            for item in batch
            if isinstance(item, Outcome) and item.work.sequence is not None
        ]
        if not ids:
            return
        try:
            with self.db().begin() as session:
                successors = ordering.released_successors(session, ids)
        except Exception:
            log.warning(
                "could not look up the next deliveries of %d ordered keys; the sweeper "
                "will wake them",
                len(ids),
                exc_info=True,
            )
            return
        if successors:
            now = self.clock()
            self.wake([(delivery_id, now) for delivery_id in successors], now)
