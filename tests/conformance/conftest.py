"""The conformance suite runs every test on every backend; a backend whose probe fails here is
skipped with the probe's reason."""

from __future__ import annotations

import pytest

from sandboxrun import backends


@pytest.fixture(params=["process-group", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    name = backends.check_name(str(request.param))
    probe = backends.probe(name)
    if not probe.available:
        pytest.skip(f"{name} unavailable here: {probe.reason}")
    return name
