"""Whether a process will go on living, read from /proc: gone, zombie, or a SIGKILL queued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sandboxrun.supervisor import procfs

STATUS = b"Name:\tsleep\nState:\tS (sleeping)\nSigQ:\t0/1\nSigPnd:\t%s\nShdPnd:\t%s\nSigBlk:\t0\n"


@pytest.mark.parametrize(
    ("sigpnd", "shdpnd", "pending"),
    [
        (b"0000000000000000", b"0000000000000000", False),
        (b"0000000000000100", b"0000000000000000", True),  # SIGKILL (9) on the thread
        (b"0000000000000000", b"0000000000000100", True),  # on the thread group
        (b"0000000000000200", b"0000000000000000", False),  # SIGUSR1 (10) is not a death
        (b"0000000000004000", b"0000000000000080", False),  # SIGTERM, SIGBUS: may be handled
        (b"ffffffffffffffff", b"0000000000000000", True),
        (b"0000000000000000", b"", False),
    ],
)
def test_death_pending_reads_both_pending_sets(sigpnd: bytes, shdpnd: bytes, pending: bool) -> None:
    assert procfs.death_pending(STATUS % (sigpnd, shdpnd)) is pending


@pytest.mark.parametrize(
    "text",
    [b"", b"SigPnd:\tzz\nShdPnd:\t\n", b"SigPnd\n", b"ShdPnd:  0x100 junk\n"],
)
def test_death_pending_on_malformed_text_is_not_a_death(text: bytes) -> None:
    assert procfs.death_pending(text) is False


def test_living_sees_a_live_process_a_zombie_and_a_gone_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert procfs.living(child.pid)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while procfs.alive(child.pid) and time.monotonic() < deadline:  # a zombie: not waited
            time.sleep(0.01)
        assert os.path.exists(f"/proc/{child.pid}")  # still there, as a zombie
        assert not procfs.living(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not procfs.living(child.pid)
    assert procfs.living(os.getpid())


def test_status_mask_is_the_union_and_all_bits_when_unread() -> None:
    text = b"SigBlk:\t0000000000000001\nSigIgn:\t0000000000000004\nSigCgt:\t0000000000004000\n"
    assert procfs.status_mask(text, b"SigIgn", b"SigCgt", b"SigBlk") == 0x4005
    assert procfs.status_mask(text, b"SigIgn", b"SigQ") == -1  # missing
    assert procfs.status_mask(b"SigIgn:\tnope\n", b"SigIgn") == -1


def test_default_deaths_leaves_out_what_a_process_handles() -> None:
    term, hup = procfs.signal_bits(signal.SIGTERM), procfs.signal_bits(signal.SIGHUP)
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(30)"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as child:
        try:
            assert child.stdout is not None and child.stdout.readline()
            assert procfs.default_deaths(child.pid, term | hup) == hup
        finally:
            child.kill()
    assert procfs.default_deaths(child.pid, term | hup) == 0  # gone: nothing is "fatal"
