from __future__ import annotations

import pytest

from sandboxrun.errors import ConfigError
from sandboxrun.image.aptsources import (
    AptSource,
    os_release_codename,
    parse_deb822,
    parse_one_line,
    pick_base,
)

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://disabled.example/debian/
Suites: bookworm
Components: main
Enabled: no
"""


def test_parse_deb822() -> None:
    assert parse_deb822(DEB822) == [
        AptSource("http://deb.debian.org/debian", "bookworm", ("main",)),
        AptSource("http://deb.debian.org/debian", "bookworm-updates", ("main",)),
        AptSource("http://deb.debian.org/debian-security", "bookworm-security", ("main",)),
    ]


def test_parse_deb822_continuation_lines() -> None:
    text = (
        "Types: deb\nURIs: http://a/debian\n  http://b/debian/\n"
        "Suites: trixie\nComponents: main contrib\n"
    )
    assert [s.uri for s in parse_deb822(text)] == ["http://a/debian", "http://b/debian"]


def test_parse_one_line() -> None:
    text = """
# comment
deb http://ftp.example/debian/ bookworm main contrib
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm-updates main
deb-src http://ftp.example/debian bookworm main
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main  # trailing
garbage line
"""
    assert parse_one_line(text) == [
        AptSource("http://ftp.example/debian", "bookworm", ("main", "contrib")),
        AptSource("http://mirror.example/debian", "bookworm-updates", ("main",)),
        AptSource("https://packages.cloud.google.com/apt", "cloud-sdk-bookworm", ("main",)),
    ]


def test_pick_base_prefers_host_codename_and_plain_suites() -> None:
    sources = [
        AptSource("http://x/debian", "bookworm-updates", ("main",)),
        AptSource("https://packages.cloud.google.com/apt", "cloud-sdk-bookworm", ("main",)),
        AptSource("http://x/debian", "trixie", ("main",)),
        AptSource("http://x/debian", "bookworm", ("main",)),
    ]
    assert pick_base(sources, "bookworm").suite == "bookworm"
    assert pick_base(sources, None).suite == "trixie"


def test_pick_base_refuses_when_nothing_fits() -> None:
    with pytest.raises(ConfigError, match="no usable Debian source"):
        pick_base([AptSource("http://x/debian", "bookworm", ("contrib",))], "bookworm")


def test_os_release_codename() -> None:
    assert os_release_codename('NAME="Debian"\nVERSION_CODENAME=bookworm\n') == "bookworm"
    assert os_release_codename('VERSION_CODENAME="trixie"') == "trixie"
    assert os_release_codename("NAME=x") is None
