"""Fixtures shared by the integration tests (a module's own fixture of the same name wins)."""

from tests.integration._publish_support import acme  # noqa: F401 - re-exported fixture
from tests.integration.fuzz_kit import seeded  # noqa: F401 - re-exported fixture
