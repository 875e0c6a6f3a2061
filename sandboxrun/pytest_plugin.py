"""Kept for installs whose ``pytest11`` entry point still names this module (an editable install
from before the move) and for ``-p sandboxrun.pytest_plugin``: it is
``sandboxrun.integrations.pytest_plugin``."""

from sandboxrun.integrations.pytest_plugin import (
    async_sandbox,
    pytest_addoption,
    pytest_configure,
    sandbox,
)

__all__ = ["async_sandbox", "pytest_addoption", "pytest_configure", "sandbox"]
