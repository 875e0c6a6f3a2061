"""A small inspect_ai task on the ``sandboxrun`` sandbox: tests/integration/test_inspect_ai.py
runs it with ``inspect eval inspect_task.py``.

The model is inspect's built-in ``mockllm/model`` with scripted outputs. ``sandboxrun_bash``: three
``bash`` tool calls (what the sandbox looks like, a command that times out leaving background
processes, the answer written to a file) and a final message. ``sandboxrun_session_tools``:
inspect's stateful ``bash_session()`` (a shell that keeps its directory and variables between
calls, through inspect's tools server in the sandbox) and ``text_editor()``. The scorer reads
the answer from the sandbox.
Run offline: every output carries its token usage (else mockllm counts tokens with tiktoken,
which downloads its encoding).
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash, bash_session, text_editor
from inspect_ai.util import sandbox

MODEL = "mockllm/model"
LOOK = "echo cwd=$(pwd); echo seed=$(cat seed.txt); echo config=${FROM_CONFIG-none}; touch /etc/x"
HANG = "sleep 120 & setsid sleep 121 & echo started; sleep 122"
ANSWER = "echo $((6 * 7)) > answer.txt; ps -eo args | grep -c '^sleep 12' || true"
NOTES = "/workspace/notes.txt"


@scorer(metrics=[accuracy()])
def in_sandbox() -> Scorer:
    """Correct when the sandbox's answer.txt holds the target."""

    async def score(state: TaskState, target: Target) -> Score:
        answer = (await sandbox().read_file("answer.txt")).strip()
        return Score(value=CORRECT if answer == target.text else INCORRECT, answer=answer)

    return score


@task
def sandboxrun_bash() -> Task:
    outputs = [
        ModelOutput.for_tool_call(MODEL, "bash", {"command": LOOK}),
        ModelOutput.for_tool_call(MODEL, "bash", {"command": HANG}),
        ModelOutput.for_tool_call(MODEL, "bash", {"command": ANSWER}),
        ModelOutput.from_content(MODEL, "The answer is in answer.txt."),
    ]
    for output in outputs:  # given, so mockllm does not count tokens (tiktoken downloads)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return Task(
        dataset=[
            Sample(
                input="Write six times seven to answer.txt.",
                target="42",
                files={"seed.txt": "planted by the sample"},
            )
        ],
        solver=[use_tools(bash(timeout=2)), generate()],
        scorer=in_sandbox(),
        sandbox="sandboxrun",
        model=get_model(MODEL, custom_outputs=outputs),
    )


@task
def sandboxrun_session_tools() -> Task:
    def call(tool: str, **arguments: str) -> ModelOutput:
        return ModelOutput.for_tool_call(MODEL, tool, arguments)

    outputs = [
        call("bash_session", action="type_submit", input="cd /tmp && X=41 && echo set"),
        call(
            "bash_session",
            action="type_submit",
            input="echo $((X + 1)) > /workspace/answer.txt; echo got=$((X + 1)) in $(pwd)",
        ),
        call("text_editor", command="create", path=NOTES, file_text="alpha\n"),
        call("text_editor", command="str_replace", path=NOTES, old_str="alpha", new_str="beta"),
        call("text_editor", command="view", path=NOTES),
        ModelOutput.from_content(MODEL, "The answer is in answer.txt."),
    ]
    for output in outputs:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return Task(
        dataset=[Sample(input="Write six times seven to answer.txt.", target="42")],
        solver=[use_tools(bash_session(), text_editor(timeout=60)), generate()],
        scorer=in_sandbox(),
        sandbox="sandboxrun",
        model=get_model(MODEL, custom_outputs=outputs),
    )


@task
def sandboxrun_image(config: str) -> Task:
    """On an image per task: ``sandbox=("sandboxrun", config)``, a Dockerfile or a compose file
    (``-T config=...``). The command reads what the image baked in and writes the answer
    relative to where it runs (the compose file's working_dir, else the workspace)."""
    look = (
        "cat /opt/marker; echo cwd=$(pwd) env=${FROM_COMPOSE-none}; cat /opt/marker > answer.txt;"
        " cat /var/tmp/data/v.txt 2>/dev/null; touch /var/tmp/data/w 2>/dev/null || echo ro"
    )
    outputs = [
        ModelOutput.for_tool_call(MODEL, "bash", {"command": look}),
        ModelOutput.from_content(MODEL, "Done."),
    ]
    for output in outputs:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return Task(
        dataset=[Sample(input="What did the image bake in?", target="baked")],
        solver=[use_tools(bash(timeout=30)), generate()],
        scorer=in_sandbox(),
        sandbox=("sandboxrun", config),
        model=get_model(MODEL, custom_outputs=outputs),
    )
