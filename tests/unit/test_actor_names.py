"""What a reader is told about who acted: partners see the publisher's people as "publisher"."""

from __future__ import annotations

import pytest

from app.services.actor import PUBLISHER, Actor, shown_to

ACME, GLOBEX = "ptn_acme", "ptn_globex"


@pytest.mark.parametrize(
    ("name", "actor_partner", "shown"),
    [
        ("operator:ops@publisher.example", None, PUBLISHER),
        ("key:test-admin", None, PUBLISHER),  # an admin key
        ("cli:root", None, PUBLISHER),
        ("system", None, "system"),  # Kurir's own jobs name nobody
        ("key:acme-robot", ACME, "key:acme-robot"),
        ("portal:acme", ACME, "portal:acme"),
        # A name alone proves nothing: an admin key may be called what acme's key is called.
        ("key:acme-robot", None, PUBLISHER),
        ("key:globex-robot", GLOBEX, PUBLISHER),
    ],
)
def test_a_partner_sees_its_own_credentials_by_name_and_everyone_else_as_publisher(
    name, actor_partner, shown
):
    assert shown_to(ACME, name, actor_partner) == shown
    assert Actor.portal(ACME, "acme").shows(name, actor_partner) == shown


@pytest.mark.parametrize("name", ["operator:ops@publisher.example", "key:acme-robot", "system"])
def test_the_publisher_sees_every_name(name):
    assert shown_to(None, name, None) == name
    assert Actor.operator("ops@publisher.example").shows(name, ACME) == name
