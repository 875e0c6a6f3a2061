"""Kept for installs whose ``inspect_ai`` entry point still names this module (an editable
install from before the move): it is ``sandboxrun.integrations.inspect.registry``."""

from sandboxrun.integrations.inspect.registry import SandboxrunSandboxEnvironment

__all__ = ["SandboxrunSandboxEnvironment"]
