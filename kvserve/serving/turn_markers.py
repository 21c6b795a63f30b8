"""The token sequences that start a user turn and an assistant turn under a chat template.

The disk tier's `cold` checkpoint is cut just before the last user-turn start that precedes
the first assistant turn (the system prompt, tools and history the next request repeats);
the engine speaks tokens, so it is handed these markers. They are found by rendering probe
conversations: the generation prompt is the assistant start, and what separates an
assistant answer from the next user message, minus the turn end, is the user start.
Trailing whitespace is dropped so the markers do not depend on how the content tokenizes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvserve.chat.conversation import ChatRequest, Message, TextPart
from kvserve.chat.render import ChatRenderer, ChatTemplateError

logger = logging.getLogger(__name__)

_U1, _A1, _U2 = "kvserve-probe-u1", "kvserve-probe-a1", "kvserve-probe-u2"


def _request(*turns: tuple[str, str]) -> ChatRequest:
    return ChatRequest(messages=tuple(Message(role, (TextPart(text),)) for role, text in turns))  # type: ignore[arg-type]


def _between(text: str, left: str, right: str) -> str | None:
    start = text.find(left)
    end = text.find(right, start + len(left)) if start >= 0 else -1
    return text[start + len(left) : end] if end >= 0 else None


def turn_marker_texts(renderer: ChatRenderer) -> tuple[str, str] | None:
    """(user start, assistant start) as text, or None when the template does not fit the probe."""
    try:
        bare = renderer.render(_request(("user", _U1)), add_generation_prompt=False)
        prompted = renderer.render(_request(("user", _U1)), add_generation_prompt=True)
        history = renderer.render(_request(("user", _U1), ("assistant", _A1), ("user", _U2)), False)
    except ChatTemplateError:
        return None
    if not prompted.startswith(bare) or len(prompted) == len(bare):
        return None
    assistant_start = prompted[len(bare) :]
    user_end_and_assistant = _between(history, _U1, _A1)  # user turn end + assistant start
    turn_end_and_user = _between(history, _A1, _U2)  # assistant turn end + user start
    if user_end_and_assistant is None or turn_end_and_user is None:
        return None
    if not user_end_and_assistant.endswith(assistant_start):
        return None
    turn_end = user_end_and_assistant[: len(user_end_and_assistant) - len(assistant_start)]
    if not turn_end_and_user.startswith(turn_end):
        return None
    user_start = turn_end_and_user[len(turn_end) :].rstrip()
    assistant_start = assistant_start.rstrip()
    return (user_start, assistant_start) if user_start and assistant_start else None


def turn_markers(renderer: ChatRenderer, tokenize: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
    """Token ids of (user start, assistant start); empty lists when they cannot be found."""
    texts = turn_marker_texts(renderer)
    if texts is None:
        logger.info("chat template: no turn markers found; cold checkpoints are cut by length")
        return [], []
    return tokenize(texts[0]), tokenize(texts[1])
