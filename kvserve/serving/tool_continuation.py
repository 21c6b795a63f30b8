"""Live tool continuation (ref §5.7): tool results continue the exact sequence that made the calls.

A Responses request carrying only `function_call_output` items, or one whose history replays the
calls, and an Anthropic request whose last user turn holds `tool_result`s, are continued as

    prompt = the previous prompt + sampled output, as exact token ids (LiveSequence)
           + the rendered tail: the template's end of the assistant turn, the tool results,
             and the next assistant turn's opening

so the whole previous turn, hidden reasoning included, is a prefix-cache hit. The tail comes from
the model's own template: the conversation is rendered with a sentinel as the calling turn's text,
and the tail is everything after the sentinel.

A history that replays the calls continues live only when the rest of it is what produced the live
sequence (same fingerprint); otherwise it is rendered as usual (always correct). Results for calls
that are neither replayed nor live are an error: 400 when the id was never seen, 409 when it was
ours but its sequence is gone (the client must replay the full history).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kvserve.chat.conversation import ChatRequest, Message, TextPart, ToolResultPart
from kvserve.serving.errors import RequestError
from kvserve.serving.live_sequences import LiveSequence, LiveSequences, request_fingerprint
from kvserve.serving.tool_memory import ToolReplayMemory, call_key

# Stands in for the calling turn's text when rendering the tail; no template alters or emits it.
SENTINEL = "\x00kvserve-live-tail\x00"


@dataclass(frozen=True)
class ContinuationWording:
    """How an API words its continuation errors (the reference's messages)."""

    api: str
    id_field: str
    history: str
    param: str

    def unknown(self, call_id: str) -> RequestError:
        return RequestError(
            f"{self.api} continuation state is not available for {self.id_field} {call_id}; "
            f"retry by replaying the full {self.history} history",
            param=self.param,
        )

    def gone(self) -> RequestError:
        return RequestError(
            f"{self.api} continuation state is not available; retry by replaying the full {self.history} history",
            param=self.param,
            status=409,
        )


RESPONSES = ContinuationWording("Responses", "call_id", "input", "input")
ANTHROPIC = ContinuationWording("Anthropic", "tool_use_id", "messages", "messages")


class ToolTail(NamedTuple):
    """A conversation cut before its trailing tool results: `head` may end with the calling turn."""

    head: tuple[Message, ...]
    tail: tuple[Message, ...]
    result_ids: tuple[str, ...]  # as the client wrote them

    @property
    def calling_turn(self) -> Message | None:
        last = self.head[-1] if self.head else None
        return last if last is not None and last.role == "assistant" else None

    @property
    def before_call(self) -> tuple[Message, ...]:
        return self.head[:-1] if self.calling_turn is not None else self.head


def split_tool_tail(messages: tuple[Message, ...]) -> ToolTail | None:
    """Messages after the last assistant turn (after the system messages when there is none), if they
    hold tool results; None otherwise."""
    cut = next((i + 1 for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    if cut is None:
        cut = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    tail = messages[cut:]
    ids = tuple(p.tool_call_id for m in tail for p in m.parts if isinstance(p, ToolResultPart))
    return ToolTail(messages[:cut], tail, ids) if ids else None


def find_live_sequence(
    request: ChatRequest,
    wording: ContinuationWording,
    live: LiveSequences | None,
    memory: ToolReplayMemory | None,
) -> tuple[ToolTail, LiveSequence] | None:
    """The live sequence `request` continues, or None to render it as usual; raises RequestError
    (400 or 409) for results whose calls are neither in the request nor live."""
    cut = split_tool_tail(request.messages)
    if cut is None:
        return None
    keys = frozenset(call_key(i) for i in cut.result_ids)
    sequence = live.lookup(keys) if live is not None else None
    if sequence is not None and _continues(request, cut, keys, sequence):
        return cut, sequence
    replayed = {call_key(c.id) for m in cut.head for c in m.tool_calls}
    unknown = [i for i in cut.result_ids if call_key(i) not in replayed]
    if not unknown:
        return None  # the calls are in the history: render it
    if any(_was_ours(call_key(i), live, memory) for i in unknown):
        raise wording.gone()
    raise wording.unknown(unknown[0])


def find_replayed_sequence(
    request: ChatRequest, live: LiveSequences | None
) -> tuple[ToolTail, LiveSequence] | None:
    """The live sequence whose calling turn `request`'s history replays (its last turn with calls),
    everything before that turn as it was, cut after that turn; None otherwise (render as usual).
    Never an error: Chat Completions and image prompts take it, also on later turns, where the
    rendered history would not continue the sampled text (a template whose history turn opens
    otherwise than its generation prompt: SmolVLM's adds a space)."""
    if live is None:
        return None
    at = next((i for i in range(len(request.messages) - 1, -1, -1) if request.messages[i].tool_calls), None)
    if at is None or request.messages[at].role != "assistant":
        return None
    keys = _keys(request.messages[at])
    cut = ToolTail(request.messages[: at + 1], request.messages[at + 1 :], ())
    sequence = live.lookup(keys)
    return (cut, sequence) if sequence is not None and _continues(request, cut, keys, sequence) else None


def _continues(request: ChatRequest, cut: ToolTail, keys: frozenset[str], sequence: LiveSequence) -> bool:
    """Output-only results trust their ids; a replayed history must be the one the sequence came from."""
    turn = cut.calling_turn
    if turn is None:
        return True
    same_calls = {call_key(c.id) for c in turn.tool_calls} == keys
    return same_calls and request_fingerprint(request, cut.before_call) == sequence.fingerprint


def _was_ours(key: str, live: LiveSequences | None, memory: ToolReplayMemory | None) -> bool:
    return (live is not None and live.knows(key)) or (memory is not None and memory.knows(key))


class PromptTokens(NamedTuple):
    token_ids: list[int]
    text: str


def continue_sequence(
    request: ChatRequest,
    cut: ToolTail,
    sequence: LiveSequence,
    render: Callable[[ChatRequest], str],
    tokenize: Callable[[str], list[int]],
) -> PromptTokens | None:
    """The continuation's prompt; None when the template cannot give a clean tail (render as usual)."""
    tail = rendered_tail(request, cut, render)
    if tail is None:
        return None
    ids, text = list(sequence.token_ids), sequence.text
    if sequence.end_text and tail.startswith(sequence.end_text):
        tail = tail[len(sequence.end_text) :]  # the template ends the turn with the token sampled
    elif sequence.end_text:  # it ends the turn otherwise: its own bytes replace the sampled EOS
        ids, text = ids[:-1], text[: len(text) - len(sequence.end_text)]
    return PromptTokens(ids + tokenize(tail), text + tail)


def rendered_tail(request: ChatRequest, cut: ToolTail, render: Callable[[ChatRequest], str]) -> str | None:
    """What the template writes after the calling turn's text: its end, the results, the next opening."""
    stand_in = Message("assistant", (TextPart(SENTINEL),))
    messages = (*cut.before_call, stand_in, *cut.tail)
    try:
        text = render(dataclasses.replace(request, messages=messages))
    except RequestError:
        return None
    if text.count(SENTINEL) != 1:
        return None
    return text[text.index(SENTINEL) + len(SENTINEL) :]


def reuse_live_prefix(
    text: str,
    messages: tuple[Message, ...],
    live: LiveSequences | None,
    tokenize: Callable[[str], list[int]],
) -> PromptTokens | None:
    """Prefix-exact assembly for a rendered prompt that replays a live tool-call turn: when the text
    starts with that sequence's text, its exact token ids (as sampled, whatever re-tokenizing would
    give) followed by the tokens of the rest. None when no live sequence is a text prefix."""
    turn = next((m for m in reversed(messages) if m.role == "assistant" and m.tool_calls), None)
    sequence = None if live is None or turn is None else live.lookup(_keys(turn))
    if sequence is None:
        return None
    candidates = [(list(sequence.token_ids), sequence.text)]
    if sequence.end_text:  # the template may end the turn with other bytes than the sampled EOS
        end = len(sequence.text) - len(sequence.end_text)
        candidates.append((list(sequence.token_ids[:-1]), sequence.text[:end]))
    for token_ids, prefix in candidates:
        if text.startswith(prefix):
            return PromptTokens(token_ids + tokenize(text[len(prefix) :]), text)
    return None


def _keys(turn: Message) -> frozenset[str]:
    return frozenset(call_key(c.id) for c in turn.tool_calls)
