"""pytest plugin (entry point ``pytest11``): the ``sandbox`` fixture. See docs/pytest.md."""
