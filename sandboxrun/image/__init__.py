"""``sandboxrun image bootstrap|build``: tooling; nothing at run time imports it."""
