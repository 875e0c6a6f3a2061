"""inspect_ai entry point: registers the ``sandboxrun`` sandbox environment. See docs/inspect.md."""
