"""Where system messages sit in the rendered prompt.

Claude Code 2.1.332 sends its environment block (9K characters of working directory, skills and
"Today's date is ...") as a `system` entry *after* the user's first message. Rendered in place, the
prompt ends `<|im_start|>system ... Today's date is 2026-12-02.<|im_end|><|im_start|>assistant`, and
a small model continues the system text instead of answering: SmolLM2-135M on that request looped
on dated lines until its output limit in every run, at any temperature (measured, docs/clients.md);
with the block before the user's message it answered and ended its turn. Chat models are trained on
user -> assistant turns; no template expects a system turn between a question and its answer.

So a system message that follows a user message is rendered just before the run of user messages it
follows. The rule is local, so history renders the same way on every later turn (the KV prefix
cache still hits), and a system message added mid-conversation later moves only past the user turn
before it, never to the top (which would change the prefix of every turn since the first). The
reference server (ds4) hoists every system message to the top; that breaks the prefix whenever a
client adds one mid-conversation.
"""

from __future__ import annotations

from kvserve.chat.conversation import Message


def system_before_user(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """`messages` with each system message that follows user messages moved before that run of
    user messages; everything else keeps its order."""
    ordered: list[Message] = []
    user_run_start: int | None = None  # where the run of user messages that ends `ordered` begins
    for message in messages:
        if message.role == "system" and user_run_start is not None:
            ordered.insert(user_run_start, message)
            user_run_start += 1
            continue
        if message.role == "user":
            if user_run_start is None:
                user_run_start = len(ordered)
        else:
            user_run_start = None
        ordered.append(message)
    return tuple(ordered)
