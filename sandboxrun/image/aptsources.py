"""Which Debian mirror and suite the host uses, from its apt configuration. Pure parsing.

``sandboxrun image bootstrap`` debootstraps from the host's own configured sources (one-line
``sources.list`` format and deb822 ``*.sources``), never from a hard-coded URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sandboxrun.errors import ConfigError


@dataclass(frozen=True)
class AptSource:
    uri: str
    suite: str
    components: tuple[str, ...]


def parse_one_line(text: str) -> list[AptSource]:
    """``deb [opts] URI SUITE COMPONENT...`` lines; comments, ``deb-src`` and junk are skipped."""
    found: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        line = re.sub(r"\[[^\]]*\]", " ", line)  # [arch=amd64 signed-by=...]
        words = line.split()
        if len(words) >= 3 and words[0] == "deb":
            found.append(AptSource(words[1].rstrip("/"), words[2], tuple(words[3:])))
    return found


def parse_deb822(text: str) -> list[AptSource]:
    """deb822 stanzas (``Types: deb``, ``URIs:``, ``Suites:``, ``Components:``, ``Enabled:``)."""
    found: list[AptSource] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0] in " \t" and key:  # continuation line
                fields[key] += " " + raw.strip()
                continue
            if ":" in raw:
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        components = tuple(fields.get("components", "").split())
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                found.append(AptSource(uri.rstrip("/"), suite, components))
    return found


def pick_base(sources: Iterable[AptSource], codename: str | None) -> AptSource:
    """The source to debootstrap from: a plain release suite (not -updates/-security/-backports)
    with ``main``; the host's own codename when it is listed."""
    candidates = [
        s
        for s in sources
        if "main" in s.components and "-" not in s.suite and s.uri.startswith(("http", "file"))
    ]
    if not candidates:
        raise ConfigError(
            "no usable Debian source in the host's apt configuration "
            "(need a 'deb' entry for a release suite with the 'main' component)"
        )
    for source in candidates:
        if source.suite == codename:
            return source
    return candidates[0]


def os_release_codename(text: str) -> str | None:
    """``VERSION_CODENAME`` from an ``/etc/os-release`` text."""
    for line in text.splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.partition("=")[2].strip().strip("\"'") or None
    return None
