"""Ordered delivery end to end: real publish, real worker and engine, real receivers on
127.0.0.1, PostgreSQL and SQLite.

A receiver here records, per ordering key (the body's `resource.id`), every request with its
`webhook-sequence` and `webhook-previous-id` and whether it was answered 2xx; the tests check
what a partner relying on the order would check.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import select, update

from app import event_types
from app.accounts import create_api_key
from app.intake.publish import publish
from app.models import DEAD, PENDING, RETRYING, SUCCEEDED, DeadLetter, Delivery, Endpoint
from app.registry import endpoints as endpoint_rules
from app.registry.partners import create_partner
from app.runtime import Runtime
from sender.sweeper import sweep
from tests.support.factories import Receiver, WorkerThread, wait_for

TYPE = "stock.changed"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
# Short retries: every step is the schedule's minimum (1 s), no jitter.
SCHEDULE = (1,) * 12


@pytest.fixture
def make_rt(make_rt: Callable[..., Runtime]) -> Callable[..., Runtime]:
    """The shared builder (tests/integration/conftest.py), with short retries and no
    disabling: 30 % failures must never add up to a disabled endpoint in these tests."""

    def build(**overrides: Any) -> Runtime:
        overrides.setdefault("retry_schedule", SCHEDULE)
        overrides.setdefault("retry_jitter", 0.0)
        overrides.setdefault("disable_after_failures", 1_000_000)
        return make_rt(**overrides)

    return build


@dataclass
class Hit:
    key: str
    event_id: str
    sequence: int | None
    previous_id: str | None
    ok: bool


class KeyedReceiver:
    """Answers by `decide(key, sequence)` (True: 200, False: 500) and logs every request."""

    def __init__(self, decide: Callable[[str, int | None], bool]) -> None:
        self.decide = decide
        self.lock = threading.Lock()
        self.hits: list[Hit] = []
        self.receiver = Receiver(self._reply)

    def _reply(self, received: Any, count: int) -> tuple[int, dict[str, str], bytes]:
        key = received.json["resource"]["id"]
        raw = received.headers.get("webhook-sequence")
        sequence = int(raw) if raw is not None else None
        ok = self.decide(key, sequence)
        with self.lock:
            self.hits.append(
                Hit(
                    key,
                    received.headers["webhook-id"],
                    sequence,
                    received.headers.get("webhook-previous-id"),
                    ok,
                )
            )
        return (200, {}, b"ok") if ok else (500, {}, b"try again")

    def __enter__(self) -> KeyedReceiver:
        self.receiver.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.receiver.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.receiver.url

    def of(self, key: str) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.key == key]


class Publisher:
    """A partner with one endpoint, and `publish(key)` through the real publish path."""

    def __init__(self, rt: Runtime, url: str, **endpoint: Any) -> None:
        self.rt = rt
        with rt.db.begin() as session:
            event_types.register(session, {"name": TYPE, "version": 1, "schema": SCHEMA})
            key, _ = create_api_key(session, "ordering-test", ["admin"])
            partner = create_partner(session, {"uid": "shop", "name": "Shop"})
            created = endpoint_rules.create_endpoint(
                session, partner, {"url": url, **endpoint}, rt.settings, rt.secret_box
            )
            self.api_key_id = key.id
            self.endpoint_id = created.endpoint.id
        self.published: dict[str, list[str]] = {}
        self.count = 0

    def publish(self, key: str) -> str:
        """Publish one event whose ordering key is the resource's `stock:<key>`."""
        self.count += 1
        result = publish(
            self.rt.db,
            self.rt.redis,
            self.rt.settings,
            partner_uid="shop",
            body={
                "type": TYPE,
                "version": 1,
                "data": {"n": self.count},
                "resource": {"type": "stock", "id": key},
            },
            api_key_id=self.api_key_id,
        )
        event_id = str(result.body["id"])
        self.published.setdefault(key, []).append(event_id)
        return event_id

    def states(self) -> dict[str, str]:
        with self.rt.db.begin() as session:
            return dict(session.execute(select(Delivery.event_id, Delivery.state)).all())

    def state_of(self, event_id: str) -> str:
        return self.states()[event_id]

    def all_in(self, events: list[str], *states: str) -> bool:
        found = self.states()
        return all(found.get(e) in states for e in events)


def check_order(receiver: KeyedReceiver, key: str, published: list[str]) -> None:
    """What a partner sees of one key: each request is the head, or a retry of it; successes
    come in publish order, numbered 1, 2, ... and chained by webhook-previous-id."""
    hits = receiver.of(key)
    successes = [h for h in hits if h.ok]
    assert [h.event_id for h in successes] == published
    assert [h.sequence for h in successes] == list(range(1, len(published) + 1))
    assert [h.previous_id for h in successes] == [None, *published[:-1]]
    head = 0
    for hit in hits:
        # Nothing of the key is sent before the one ahead of it succeeded.
        assert hit.event_id == published[head], (key, hit, head)
        if hit.ok:
            head += 1


def test_each_key_arrives_in_publish_order_with_gap_free_sequences_despite_30pct_failures(
    make_rt: Callable[..., Runtime],
) -> None:
    rt = make_rt()
    rng = random.Random(15)  # noqa: S311 - a reproducible failure pattern, not security
    lock = threading.Lock()

    def flaky(key: str, sequence: int | None) -> bool:
        with lock:
            return rng.random() >= 0.3

    with KeyedReceiver(flaky) as receiver:
        publisher = Publisher(rt, receiver.url + "/hook", ordering="key")
        # Publishing while the worker delivers: successors are committed while their
        # predecessors are in flight, retrying or just recorded.
        with WorkerThread(rt):
            for i in range(1000):
                publisher.publish(f"k{i % 50}")
            events = [e for ids in publisher.published.values() for e in ids]
            wait_for(
                lambda: publisher.all_in(events, SUCCEEDED),
                timeout_s=180,
                interval_s=0.2,
                message="1,000 ordered deliveries",
            )
    assert sum(not h.ok for h in receiver.hits) > 100  # the failures did happen
    for key, published in publisher.published.items():
        assert len(published) == 20
        check_order(receiver, key, published)


def test_a_retrying_head_holds_only_its_own_key(make_rt: Callable[..., Runtime]) -> None:
    rt = make_rt()
    stuck = threading.Event()
    stuck.set()

    def decide(key: str, sequence: int | None) -> bool:
        return not (key == "slow" and stuck.is_set())

    with KeyedReceiver(decide) as receiver:
        publisher = Publisher(rt, receiver.url + "/hook", ordering="key")
        for _ in range(5):
            publisher.publish("slow")
            for k in range(10):
                publisher.publish(f"fast{k}")
        fast = [e for key, ids in publisher.published.items() if key != "slow" for e in ids]
        slow = publisher.published["slow"]
        with WorkerThread(rt):
            wait_for(
                lambda: publisher.all_in(fast, SUCCEEDED), timeout_s=60, message="the other keys"
            )
            # Measured at the moment the other keys are done: the slow head still retries,
            # and nothing behind it was sent.
            assert publisher.state_of(slow[0]) in (RETRYING, PENDING, "delivering")
            assert publisher.all_in(slow[1:], PENDING)
            assert {h.event_id for h in receiver.of("slow")} == {slow[0]}
            stuck.clear()
            wait_for(
                lambda: publisher.all_in(slow, SUCCEEDED),
                timeout_s=60,
                message="the slow key after its head recovered",
            )
    for key, published in publisher.published.items():
        check_order(receiver, key, published)


def _held(rt: Runtime, publisher: Publisher, receiver: KeyedReceiver, bad: list[str]) -> None:
    """The key stays held: a sweep and an idle engine send nothing behind the dead head."""
    sweep(rt)
    assert publisher.all_in(bad[1:], PENDING)
    assert {h.event_id for h in receiver.of("bad")} == {bad[0]}


def _blocked(client: Any, auth: dict[str, str], endpoint_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/partners/shop/endpoints/{endpoint_id}/blocked-keys", headers=auth)
    assert response.status_code == 200, response.get_json()
    return list(response.get_json()["data"])


def _setup_dead_head(
    make_rt: Callable[..., Runtime], receiver: KeyedReceiver, on_dead: str
) -> tuple[Runtime, Publisher]:
    """Key "bad": 3 events whose head fails both its attempts; key "good": 2 events."""
    rt = make_rt(retry_schedule=(1,))
    publisher = Publisher(rt, receiver.url + "/hook", ordering="key", on_dead=on_dead)
    for _ in range(3):
        publisher.publish("bad")
    for _ in range(2):
        publisher.publish("good")
    return rt, publisher


@pytest.mark.parametrize("release", ["resend", "discard", "skip"])
def test_block_holds_the_key_until_an_operator_resends_discards_or_skips(
    make_rt: Callable[..., Runtime], client: Any, auth: dict[str, str], release: str
) -> None:
    failing = threading.Event()
    failing.set()

    def decide(key: str, sequence: int | None) -> bool:
        return not (key == "bad" and sequence == 1 and failing.is_set())

    with KeyedReceiver(decide) as receiver:
        rt, publisher = _setup_dead_head(make_rt, receiver, "block")
        bad, good = publisher.published["bad"], publisher.published["good"]
        with WorkerThread(rt):
            wait_for(
                lambda: publisher.state_of(bad[0]) == DEAD and publisher.all_in(good, SUCCEEDED),
                timeout_s=30,
                message="the head dead, the other key delivered",
            )
            _held(rt, publisher, receiver, bad)
            [blocked] = _blocked(client, auth, publisher.endpoint_id)
            assert blocked["ordering_key"] == "stock:bad"
            assert blocked["sequence"] == 1 and blocked["event"] == bad[0]
            assert blocked["waiting"] == 2
            failing.clear()
            letter = blocked["dead_letter"]
            if release == "skip":
                # Changing the endpoint to on_dead "skip" lets every held key go on.
                answer = client.patch(
                    f"/v1/partners/shop/endpoints/{publisher.endpoint_id}",
                    headers=auth,
                    json={"on_dead": "skip"},
                )
            else:
                answer = client.post(f"/v1/dead-letters/{letter}/{release}", headers=auth, json={})
            assert answer.status_code == 200, answer.get_json()
            expected = bad if release == "resend" else bad[1:]
            wait_for(
                lambda: publisher.all_in(expected, SUCCEEDED),
                timeout_s=30,
                message=f"the key released by {release}",
            )
            assert _blocked(client, auth, publisher.endpoint_id) == []
    successes = [h for h in receiver.of("bad") if h.ok]
    assert [h.event_id for h in successes] == expected
    # Numbers stay the ones given at publish: a discarded head leaves its number out, and
    # webhook-previous-id names it, so the partner can tell what it never received.
    assert [h.sequence for h in successes] == ([1, 2, 3] if release == "resend" else [2, 3])
    assert successes[0].previous_id == (None if release == "resend" else bad[0])
    check_order(receiver, "good", good)


def test_skip_goes_on_with_the_next_event_after_a_dead_head(
    make_rt: Callable[..., Runtime], client: Any, auth: dict[str, str]
) -> None:
    def decide(key: str, sequence: int | None) -> bool:
        return not (key == "bad" and sequence == 1)

    with KeyedReceiver(decide) as receiver:
        rt, publisher = _setup_dead_head(make_rt, receiver, "skip")
        bad = publisher.published["bad"]
        with WorkerThread(rt):
            wait_for(
                lambda: (
                    publisher.state_of(bad[0]) == DEAD
                    and publisher.all_in(bad[1:] + publisher.published["good"], SUCCEEDED)
                ),
                timeout_s=30,
                message="the key going on past its dead head",
            )
    hits = receiver.of("bad")
    assert [h.event_id for h in hits] == [bad[0], bad[0], bad[1], bad[2]]
    assert [h.sequence for h in hits if h.ok] == [2, 3]
    assert _blocked(client, auth, publisher.endpoint_id) == []
    with rt.db.begin() as session:
        assert session.scalar(select(DeadLetter.event_id)) == bad[0]


def test_concurrent_publishers_of_one_key_get_one_gap_free_chain(
    make_rt: Callable[..., Runtime],
) -> None:
    rt = make_rt()
    publisher = Publisher(rt, "http://127.0.0.1:9/never", ordering="key")
    errors: list[BaseException] = []

    def publish_many() -> None:
        try:
            for _ in range(25):
                publish(
                    rt.db,
                    rt.redis,
                    rt.settings,
                    partner_uid="shop",
                    body={"type": TYPE, "version": 1, "data": {"n": 1}, "ordering_key": "one"},
                    api_key_id=publisher.api_key_id,
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    with rt.db.begin() as session:
        rows = session.execute(
            select(
                Delivery.event_id,
                Delivery.ordering_seq,
                Delivery.previous_event_id,
                Delivery.ordering_key,
            ).order_by(Delivery.ordering_seq)
        ).all()
    assert [r.ordering_seq for r in rows] == list(range(1, 101))
    assert {r.ordering_key for r in rows} == {"one"}
    assert [r.previous_event_id for r in rows] == [None] + [r.event_id for r in rows[:-1]]


def test_the_sweeper_leaves_a_held_delivery_alone_and_takes_the_head(
    make_rt: Callable[..., Runtime],
) -> None:
    from datetime import timedelta

    from app.clock import utcnow
    from sender.sweeper import orphans

    rt = make_rt()
    publisher = Publisher(rt, "http://127.0.0.1:9/never", ordering="key")
    head, held = publisher.publish("k"), publisher.publish("k")
    unordered = publisher.publish("k2")
    now = utcnow()
    with rt.db.begin() as session:
        # Long past the grace a fresh row gets: the sweeper would take any of them.
        session.execute(update(Delivery).values(updated_at=now - timedelta(minutes=5)))
        by_delivery = dict(session.execute(select(Delivery.id, Delivery.event_id)).all())
        for lost in (False, True):
            found = {by_delivery[i] for i in orphans(session, now, redis_lost=lost)}
            assert found == {head, unordered}, lost
    assert held not in found


def test_turning_ordering_on_applies_to_the_very_next_publish(
    make_rt: Callable[..., Runtime],
) -> None:
    rt = make_rt()
    publisher = Publisher(rt, "http://127.0.0.1:9/never")
    before = publisher.publish("k")  # on PostgreSQL, this caches the endpoints
    with rt.db.begin() as session:
        endpoint = session.get_one(Endpoint, publisher.endpoint_id)
        endpoint_rules.update_endpoint(session, endpoint, {"ordering": "key"}, rt.settings)
    after = publisher.publish("k")
    with rt.db.begin() as session:
        seqs = dict(session.execute(select(Delivery.event_id, Delivery.ordering_seq)).all())
    assert seqs == {before: None, after: 1}
