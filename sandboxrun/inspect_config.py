"""Kept for the documented path: ``sandboxrun.inspect_config`` is
``sandboxrun.integrations.inspect.config``."""

from sandboxrun.integrations.inspect.config import SandboxrunConfig, load_config, parse_config

__all__ = ["SandboxrunConfig", "load_config", "parse_config"]
