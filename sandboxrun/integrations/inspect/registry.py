"""inspect_ai entry point: registers the ``sandboxrun`` sandbox environment. See docs/inspect.md.

inspect imports this module (``[project.entry-points.inspect_ai]``) when it loads its plugins;
nothing else should: importing it imports inspect_ai.
"""

from sandboxrun.integrations.inspect.sandbox import SandboxrunSandboxEnvironment

__all__ = ["SandboxrunSandboxEnvironment"]
