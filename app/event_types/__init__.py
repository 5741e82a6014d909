"""Event types: named, versioned JSON Schemas (each version's contract) that every published
`data` must satisfy.

A published version never changes its schema (registering it again with another schema is a
conflict), so a compiled validator can be cached for the life of the process, keyed by the
event type's row id. Only the `deprecated` flag and the sunset can change, and they are
re-read on every publish.

A version N may declare how to make version N-1 from it: `downgrade`, a JMESPath expression
over N's `data` (declared, not coded: nothing runs but the expression). It is checked at
registration against N's `examples`, whose results must satisfy N-1's schema, and it is as
immutable as the schema. Chains compose: 3 -> 2 -> 1, at most `MAX_DOWNGRADE_HOPS` links.
`produce` makes every version a publish needs, from the publisher's renditions first, then the
chain. Every expression runs under the bounds of `downgrades` (static limits at
registration, a work and size budget on every run), and every version it makes is at most
`KURIR_MAX_PAYLOAD_BYTES` of JSON.

`schema` checks and compiles schemas, `registry` registers and reads versions, `versions`
produces the versions a publish needs, `downgrades` bounds the expressions, `examples` makes
the catalog's examples.
"""

from app.event_types.registry import (  # noqa: F401 - the package's public names
    MAX_DESCRIPTION,
    MAX_DOWNGRADE,
    MAX_DOWNGRADE_HOPS,
    MAX_EXAMPLES,
    MAX_VERSION,
    NAME_PATTERN,
    RESERVED_PREFIX,
    TEST_EVENT,
    TEST_EVENT_DESCRIPTION,
    TEST_EVENT_SCHEMA,
    TEST_EVENT_VERSION,
    Contract,
    Registered,
    apply_downgrade,
    compile_downgrade,
    contract_for,
    contract_from,
    deprecate,
    ensure_test_contract,
    existing_names,
    find,
    get,
    is_operational,
    is_reserved,
    lookup_columns,
    register,
    registered_pairs,
)
from app.event_types.schema import (  # noqa: F401
    MAX_ERRORS,
    VALIDATORS_MAX,
    canonical_json,
    check_schema,
    compile_schema,
    data_errors,
    schema_digest,
    validators,
)
from app.event_types.versions import (  # noqa: F401
    Version,
    VersionInvalid,
    VersionTooLarge,
    VersionUnavailable,
    compiled_downgrades,
    produce,
    reachable,
    unreachable_pins,
    versions_of,
)
