"""``run``/``create --image-from PATH`` for real (issue 20): built once per content, reused,
run on. Apart from tests/integration/test_images.py because it runs sandboxes (containers):
scripts/test.sh runs test_images.py beside the outer suite, where only image builds may go on.
"""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import suppress
from pathlib import Path

from test_images import CLI, Engine, cli, engine

__all__ = ["engine"]  # the fixture, used by name


def test_image_from_builds_once_per_content_and_runs_on_it(engine: Engine, tmp_path: Path) -> None:
    """issue 20: ``run``/``create --image-from PATH`` (a Dockerfile or its directory) build the
    image the first time, tagged by its content, and reuse it silently after; ``--dry-run``
    builds nothing; bad input is refused in one line, before anything is built."""
    import sandboxrun
    from sandboxrun.image.source import planned_tag

    env = tmp_path / "env"
    env.mkdir()
    (env / "Dockerfile").write_text(f"FROM {engine.bootstrap}\nRUN echo baked > /opt/marker\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = planned_tag(env)
    assert re.fullmatch(r"sandboxrun/project:[0-9a-f]{12}", tag), tag
    assert not engine.client.api.images(name=tag), f"{tag} exists before the test"
    try:
        dry = cli("run", "-w", str(ws), "--image-from", str(env), "--dry-run", "--", "true")
        assert dry.returncode == 0, dry.stderr
        assert not engine.client.api.images(name=tag)  # a dry run builds nothing
        first = cli("run", "-w", str(ws), "--image-from", str(env), "--", "cat", "/opt/marker")
        assert first.returncode == 0 and first.stdout == "baked\n", first
        assert f"building {tag} on {engine.bootstrap}" in first.stderr
        engine.made.append(str(engine.image(tag)["Id"]))
        again = cli(
            "run", "-w", str(ws), "--image-from", str(env / "Dockerfile"),
            "--", "cat", "/opt/marker",
        )  # fmt: skip
        assert again.returncode == 0 and again.stdout == "baked\n", again
        assert "image build" not in again.stderr  # the same content: reused, nothing said
        assert sandboxrun.image_from(env) == tag  # the Python API: the same image
        runtime = tmp_path / "rt"
        made = subprocess.run(
            [*CLI, "create", "--name", "imgfrom", "-w", str(ws), "--image-from", str(env)],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "SANDBOXRUN_RUNTIME_DIR": str(runtime)},
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        for argv in (["exec", "imgfrom", "--", "cat", "/opt/marker"], ["rm", "imgfrom"]):
            done = subprocess.run(
                [*CLI, *argv], capture_output=True, text=True, timeout=120, check=False,
                env={**os.environ, "SANDBOXRUN_RUNTIME_DIR": str(runtime)},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout == ("baked\n" if argv[0] == "exec" else "imgfrom\n")
        (env / "extra.txt").write_text("a change to the context\n")
        assert planned_tag(env) != tag  # another content, another image
        (env / "Dockerfile.alt").write_text((env / "Dockerfile").read_text())
        assert planned_tag(env / "Dockerfile.alt") != planned_tag(env)  # which file counts too
        if os.geteuid() == 0:  # the docker backend's own refusals come before a build too
            other = tmp_path / "env2"
            other.mkdir()
            (other / "Dockerfile").write_text(f"FROM {engine.bootstrap}\nRUN echo other\n")
            held = tmp_path / "held"
            (held / "sub").mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "none", str(held / "sub")], check=True)
            try:
                refused = cli("run", "-w", str(ws), "--image-from", str(other),
                              "--mount", f"{held}:/var/tmp/h", "--", "true")  # fmt: skip
            finally:
                subprocess.run(["umount", str(held / "sub")], check=True)
            assert refused.returncode == 125, refused
            assert "is a file system mounted inside it" in refused.stderr
            assert not engine.client.api.images(name=planned_tag(other))  # nothing was built
        for argv, words in [
            (["--image", "x", "--image-from", str(env)], "--image and --image-from: give one"),
            (["-b", "process-group", "--image-from", str(env)], "needs the docker backend"),
            (["--image-from", str(tmp_path / "nope")], "nope: no such file or directory"),
            (["--image-from", str(ws)], f"{ws}: the directory has no Dockerfile"),
        ]:
            refused = cli("run", "-w", str(ws), *argv, "--", "true")
            assert refused.returncode == 125 and words in refused.stderr, (argv, refused.stderr)
    finally:
        with suppress(Exception):
            engine.client.api.remove_image(tag)
