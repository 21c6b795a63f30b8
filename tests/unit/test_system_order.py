"""System messages after a user message render before it (chat/system_order.py)."""

from __future__ import annotations

from kvserve.chat.conversation import ChatRequest, Message, TextPart
from kvserve.chat.render import CHATML_TEMPLATE, ChatRenderer
from kvserve.chat.system_order import system_before_user


def _m(role: str, text: str) -> Message:
    return Message(role, (TextPart(text),))  # type: ignore[arg-type]


def _roles(messages: tuple[Message, ...]) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


def test_claude_code_environment_block_moves_before_the_question() -> None:
    # Claude Code 2.1.332: system prompt, the user's message, then the environment as a system entry.
    given = (_m("system", "S"), _m("user", "hello"), _m("system", "env"))
    assert _roles(system_before_user(given)) == ["system:S", "system:env", "user:hello"]


def test_a_run_of_users_stays_together_and_system_runs_keep_their_order() -> None:
    given = (_m("user", "a"), _m("user", "b"), _m("system", "x"), _m("system", "y"), _m("user", "c"))
    assert _roles(system_before_user(given)) == ["system:x", "system:y", "user:a", "user:b", "user:c"]


def test_later_turns_render_the_earlier_ones_unchanged() -> None:
    # The prefix-cache property: turn 2's rendering starts with turn 1's (without its generation prompt).
    turn1 = (_m("system", "S"), _m("user", "q1"), _m("system", "env"))
    turn2 = (*turn1, _m("assistant", "a1"), _m("user", "q2"), _m("system", "late"))
    one, two = system_before_user(turn1), system_before_user(turn2)
    assert two[: len(one)] == one
    assert _roles(two)[3:] == ["assistant:a1", "system:late", "user:q2"]
    renderer = ChatRenderer(CHATML_TEMPLATE)
    first = renderer.render(ChatRequest(turn1), add_generation_prompt=False)
    assert renderer.render(ChatRequest(turn2)).startswith(first)


def test_system_after_assistant_or_tool_stays_in_place() -> None:
    given = (_m("user", "q"), _m("assistant", "a"), _m("system", "s"), _m("tool", "t"), _m("system", "u"))
    assert system_before_user(given) == given
    assert system_before_user(()) == ()


def test_the_rendered_prompt_ends_with_the_question() -> None:
    request = ChatRequest((_m("system", "S"), _m("user", "Say hello"), _m("system", "Today is Monday.")))
    text = ChatRenderer(CHATML_TEMPLATE).render(request)
    assert text.endswith("<|im_start|>user\nSay hello<|im_end|>\n<|im_start|>assistant\n")
    assert text.index("Today is Monday.") < text.index("Say hello")
