"""What the tests (and the benches) share: servers, factories and kits that are not fixtures."""
