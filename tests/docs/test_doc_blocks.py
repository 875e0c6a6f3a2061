"""The Markdown block finder of the docs test (pure logic)."""

from __future__ import annotations

import pytest
from doc_blocks import DocBlockError, console_commands, parse


def doc(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_languages_kinds_and_lines() -> None:
    text = doc(
        "# Title",
        "```sh",
        "echo one",
        "```",
        "```bash",
        "echo two",
        "```",
        "```python",
        "print(3)",
        "```",
        "```",
        "not code",
        "```",
        "```ini",
        "[pytest]",
        "```",
        "```Console",
        "$ echo four",
        "four",
        "```",
        "~~~py",
        "print(5)",
        "~~~",
    )
    blocks = parse("a.md", text)
    assert [(b.line, b.language, b.kind) for b in blocks] == [
        (2, "sh", "shell"),
        (5, "bash", "shell"),
        (8, "python", "python"),
        (17, "console", "shell"),
        (21, "py", "python"),
    ]
    assert [b.code for b in blocks] == [
        "echo one\n",
        "echo two\n",
        "print(3)\n",
        "echo four\n",
        "print(5)\n",
    ]
    assert blocks[0].id == "a.md:2"
    assert all(b.exit == 0 and b.not_run is None for b in blocks)


def test_markers() -> None:
    text = doc(
        "<!-- not-run: needs a GPU -->",
        "```sh",
        "train",
        "```",
        "",
        "<!-- exit: 124 -->",
        "```sh",
        "timeout 1 sleep 5",
        "```",
        "<!-- run: pytest -->",
        "<!-- exit: 1 -->",
        "```python",
        "def test_x(): assert False",
        "```",
    )
    first, second, third = parse("m.md", text)
    assert (first.not_run, first.exit) == ("needs a GPU", 0)
    assert (second.not_run, second.exit) == (None, 124)
    assert (third.kind, third.exit) == ("pytest", 1)


def test_indented_block_in_a_list_is_dedented() -> None:
    text = doc("- step:", "", "  ```sh", "  if true; then", "    echo x", "  fi", "  ```")
    (block,) = parse("l.md", text)
    assert block.code == "if true; then\n  echo x\nfi\n"


def test_longer_fence_holds_a_shorter_one() -> None:
    text = doc("````python", 'S = """', "```sh", "not a block", "```", '"""', "````")
    (block,) = parse("f.md", text)
    assert block.code == 'S = """\n```sh\nnot a block\n```\n"""\n'


def test_console_commands_and_continuations() -> None:
    text = doc("$ echo a \\", "  b", "a b", "$ true", "output", "$")
    assert console_commands(text) == "echo a \\\n  b\ntrue\n\n"


def test_other_html_comments_are_not_markers() -> None:
    text = doc("<!-- a note, not a marker -->", "```sh", "true", "```")
    (block,) = parse("c.md", text)
    assert block.not_run is None


MALFORMED = [
    (doc("<!-- not-run: -->", "```sh", "x", "```"), "needs a value"),
    (doc("<!-- notrun: typo -->", "```sh", "x", "```"), "unknown marker 'notrun'"),
    (doc("<!-- exit: two -->", "```sh", "x", "```"), "exit must be a number"),
    (doc("<!-- exit: 1 -->", "<!-- exit: 2 -->", "```sh", "x", "```"), "given twice"),
    (doc("<!-- run: pytest -->", "```sh", "x", "```"), "only 'run: pytest' on python"),
    (doc("<!-- run: node -->", "```python", "x", "```"), "only 'run: pytest'"),
    (doc("<!-- not-run: why -->", "```text", "x", "```"), "never run"),
    (doc("<!-- not-run: why -->", "", "```sh", "x", "```"), "just before the opening fence"),
    (doc("text", "<!-- exit: 3 -->", "text"), "just before the opening fence"),
    (doc("```sh", "x"), "never closed"),
    (doc("```sh", "", "```"), "empty sh block"),
    (doc("```console", "no prompt here", "```"), "empty console block"),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_docs_are_errors(text: str, message: str) -> None:
    with pytest.raises(DocBlockError, match=message):
        parse("bad.md", text)
