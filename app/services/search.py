"""One search box for events and their deliveries, used by the operator UI (deliveries and
events) and the partner portal (its delivery log) alike.

What a reader holds is an identifier or a word: the event id (the `webhook-id` a partner
received), the resource id or correlation id the publisher set, or words of the payload.
`Search.parse` reads the box once; `event_condition` is what it matches on `events`:

- one token `evt_…`: that event (its primary key);
- one token otherwise: an event whose resource id or correlation id is exactly it (both
  indexed), or whose payload holds it;
- several words ("quoted phrases" stay together): events whose payload holds every one.

Payload words are matched with a case-insensitive `LIKE` on the stored body, within the
last `PAYLOAD_WINDOW` unless the filter's own `since` says from when, so that one search
never reads every event ever kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_
from sqlalchemy.sql.elements import ColumnElement

from app.clock import utcnow
from app.ids import id_floor
from app.models import Event
from dlq.search import MAX_Q_WORDS, MAX_WORD_LENGTH, query_words

PAYLOAD_WINDOW = timedelta(days=7)


def _like(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True)
class Search:
    """A parsed search box: its words (never empty)."""

    words: tuple[str, ...]

    @classmethod
    def parse(cls, raw: str | None) -> tuple[Search | None, str | None]:
        """The search, or None for an empty box; and a message when it cannot be read."""
        words = query_words((raw or "").strip())
        if not words:
            return None, None
        if len(words) > MAX_Q_WORDS:
            return None, f"at most {MAX_Q_WORDS} words"
        if any(len(w) > MAX_WORD_LENGTH for w in words):
            return None, f"words are at most {MAX_WORD_LENGTH} characters"
        return cls(tuple(words)), None

    @property
    def single(self) -> str | None:
        return self.words[0] if len(self.words) == 1 else None

    def event_condition(self, since: datetime | None = None) -> ColumnElement[bool]:
        """SQL on `events`: the events this search finds (`since`: where the payload words
        look back to; default PAYLOAD_WINDOW ago)."""
        token = self.single
        if token is not None and token.startswith("evt_"):
            return Event.id == token
        start = since or (utcnow() - PAYLOAD_WINDOW)
        in_payload = and_(
            Event.id >= id_floor("evt", start),
            *(Event.payload.ilike(_like(w), escape="\\") for w in self.words),
        )
        if token is None:
            return in_payload
        return or_(Event.resource_id == token, Event.correlation_id == token, in_payload)
