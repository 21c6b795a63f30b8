"""The chat messages sent for a case: one system line and the question with its answer format."""

from __future__ import annotations

from typing import Any

from kvserve.eval.eval_case import AnswerKind, EvalCase

SYSTEM = (
    "You are solving a benchmark question. Reason carefully but briefly. "
    "The final answer must follow the requested format exactly."
)
TOOL_SYSTEM = "You are a helpful assistant. When a tool can do what the user asks, call it."

_FORMAT = {
    AnswerKind.CHOICE: "Finish with a line of the form `Answer: <letter>`.",
    AnswerKind.INTEGER: "Finish with a line of the form `Answer: <integer>`.",
    AnswerKind.STRING: "Finish with a line of the form `Answer: <answer>`.",
    AnswerKind.SEQUENCE: "Finish with a line of the form `Answer: <items separated by commas>`.",
    AnswerKind.LINE_SET: "Finish with a line of the form `Answer: <line number or comma-separated line numbers>`.",
}


def messages_for(case: EvalCase) -> list[dict[str, Any]]:
    """OpenAI Chat messages (wire dicts) for the case."""
    if case.kind is AnswerKind.TOOL_CALL:
        return [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": case.prompt}]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_text(case)}]


def user_text(case: EvalCase) -> str:
    if case.kind is AnswerKind.CODE:
        return (
            "Complete the following Python function. Reply with the whole function, including the "
            f"signature, in one ```python code block.\n\n```python\n{case.prompt}```"
        )
    text = case.prompt.rstrip()
    if case.choices:
        letters = "ABCDEFGHIJ"
        text += "\n\nChoices:\n" + "\n".join(f"{letters[i]}. {c}" for i, c in enumerate(case.choices))
    return f"{text}\n\n{_FORMAT[case.kind]}"
