"""The agent loop: generate, run the tool calls, feed the results back, until the model answers
without calling a tool. Compaction happens before a generation when the context runs short. A
cancel (Ctrl+C) stops the generation or tool in flight and leaves a transcript any server accepts:
every tool call has its result, a partial answer is kept and marked."""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kvserve.agent import compaction, prompts
from kvserve.agent.client import ModelError
from kvserve.agent.events import ModelRequest, ReplyBuilder, StreamEvent
from kvserve.agent.messages import Message, ToolCall, Usage
from kvserve.agent.session import Session
from kvserve.agent.toolbox import Toolbox, ToolOutcome

# Tool results longer than this are cut when an oversized head must be summarized.
ELIDED_TOOL_CHARS = 2000


class StreamingModel(Protocol):
    def stream(self, request: ModelRequest, cancel: threading.Event) -> Iterator[StreamEvent]: ...


class Observer(Protocol):
    """What the UI hears about; every method may be a no-op."""

    def on_generation_start(self, kind: str) -> None: ...  # "answer" or "summary"
    def on_stream_event(self, event: StreamEvent) -> None: ...
    def on_generation_end(self, usage: Usage) -> None: ...
    def on_tool_start(self, call: ToolCall) -> None: ...
    def on_tool_end(self, call: ToolCall, outcome: ToolOutcome) -> None: ...
    def on_notice(self, text: str) -> None: ...


class TurnStatus(enum.Enum):
    DONE = "done"
    CANCELLED = "cancelled"
    ERROR = "error"
    MAX_STEPS = "max_steps"


@dataclass(frozen=True)
class TurnResult:
    status: TurnStatus
    text: str = ""
    error: str | None = None


@dataclass(frozen=True)
class LoopConfig:
    context_length: int
    max_tokens: int = 4096
    max_steps: int = 50
    temperature: float | None = None
    reasoning_effort: str | None = None
    is_kvserve: bool = False  # send the `kvserve` cache-hint extension (docs/agent.md)


class Agent:
    def __init__(
        self,
        model: StreamingModel,
        toolbox: Toolbox,
        session: Session,
        config: LoopConfig,
        observer: Observer,
        cancel: threading.Event | None = None,
    ):
        self.model = model
        self.toolbox = toolbox
        self.session = session
        self.config = config
        self.observer = observer
        self.cancel = cancel or toolbox.ctx.cancel
        self.estimator = compaction.TokenEstimator()
        # Messages the last usage report covers: none for a new session (estimate them all).
        self.num_counted = len(session.messages) if session.usage.prompt_tokens else 0

    # --- context accounting -------------------------------------------------------------------

    def context_used(self) -> int:
        uncounted = self.session.messages[self.num_counted :]
        return self.session.usage.context_tokens + self.estimator.tokens(uncounted)

    # --- one user turn ------------------------------------------------------------------------

    def run_turn(self, text: str) -> TurnResult:
        self.cancel.clear()
        self.session.messages.append(Message("user", text))
        try:
            return self._steps()
        except ModelError as error:
            self.observer.on_notice(f"model error: {error}")
            return TurnResult(TurnStatus.ERROR, error=str(error))

    def _steps(self) -> TurnResult:
        pending_note: str | None = None  # an internal instruction sent with the next request only
        merge_into_last = False
        for _ in range(self.config.max_steps):
            if compaction.should_compact(self.context_used(), self.config.context_length):
                self.compact()
            extra = [Message("user", pending_note, is_internal=True)] if pending_note else []
            reply = self._generate_answer(extra)
            pending_note = None
            if reply.finish_reason == "cancelled":
                self._keep_partial(reply, merge_into_last)
                return TurnResult(TurnStatus.CANCELLED, reply.content)
            # The usage just reported covers the conversation plus this reply (merged or appended).
            self.num_counted = len(self.session.messages) + (0 if merge_into_last else 1)
            message = reply.message()
            if merge_into_last:
                message = _merged(self.session.messages.pop(), message)
                merge_into_last = False
            if reply.finish_reason == "length":
                pending_note, merge_into_last = self._after_length_cut(message)
                if pending_note is not None:
                    continue
                return TurnResult(TurnStatus.DONE, message.content)
            self.session.messages.append(message)
            if not message.tool_calls:
                return TurnResult(TurnStatus.DONE, message.content)
            if not self._run_tools(message.tool_calls):
                return TurnResult(TurnStatus.CANCELLED)
        return TurnResult(TurnStatus.MAX_STEPS, error=f"stopped after {self.config.max_steps} steps")

    def _after_length_cut(self, message: Message) -> tuple[str | None, bool]:
        """A reply cut by the token limit. A cut tool call is dropped (never executed) and the model is
        told to retry; a cut answer is continued in the same message once the context is compacted.
        Returns (note for the next request, whether its reply continues `message`)."""
        near_full = compaction.should_compact(self.context_used(), self.config.context_length)
        if message.tool_calls:
            self.session.messages.append(replace(message, tool_calls=()))
            self.observer.on_notice("a tool call was cut off by the token limit; it was not executed")
            if near_full:
                self.compact()
            return prompts.CUT_TOOL_CALL, False
        self.session.messages.append(message)
        if not near_full:
            return None, False  # max_tokens per generation reached with room to spare: stop here
        if not self.compact():
            return None, False
        return prompts.CONTINUE_ANSWER, True

    def _run_tools(self, calls: tuple[ToolCall, ...]) -> bool:
        """Runs the calls in order; after a cancel the rest get a 'not run' result. False if cancelled."""
        for call in calls:
            if self.cancel.is_set():
                outcome = ToolOutcome(prompts.NOT_RUN, is_error=True)
            else:
                self.observer.on_tool_start(call)
                outcome = self.toolbox.execute(call)
                if self.cancel.is_set():
                    outcome = ToolOutcome(f"{outcome.text}\n{prompts.INTERRUPTED}", is_error=True)
                self.observer.on_tool_end(call, outcome)
            self.session.messages.append(
                Message("tool", outcome.text, tool_call_id=call.call_id, name=call.name, image=outcome.image)
            )
        return not self.cancel.is_set()

    def _keep_partial(self, reply: ReplyBuilder, merge_into_last: bool) -> None:
        """A cancelled generation: keep the text so far (its tool calls may be incomplete: dropped)."""
        text = reply.content.rstrip()
        if not text:
            return
        partial = Message("assistant", f"{text}\n{prompts.INTERRUPTED}", reply.reasoning)
        if merge_into_last:
            partial = _merged(self.session.messages.pop(), partial)
        self.session.messages.append(partial)

    # --- generation ---------------------------------------------------------------------------

    def _generate_answer(self, extra: list[Message]) -> ReplyBuilder:
        """The hard trigger: a prompt the server finds too long is compacted and tried once more."""
        try:
            return self._generate([*self.session.messages, *extra], "answer")
        except ModelError as error:
            if not error.is_context_overflow:
                raise
            self.observer.on_notice("the prompt no longer fits the context")
            if not self.compact(keep_tail=False):
                raise
            return self._generate([*self.session.messages, *extra], "answer")

    def _generate(self, messages: list[Message], kind: str, max_tokens: int | None = None) -> ReplyBuilder:
        request = ModelRequest(
            tuple(messages),
            tuple(self.toolbox.wire_specs()),
            max_tokens or self.config.max_tokens,
            self.config.temperature,
            self.config.reasoning_effort,
            "none" if kind == "summary" else None,
            self._extension(kind),
        )
        self.observer.on_generation_start(kind)
        reply = ReplyBuilder()
        for event in self.model.stream(request, self.cancel):
            reply.add(event)
            self.observer.on_stream_event(event)
        if not reply.finish_reason:
            self.observer.on_generation_end(reply.usage)
            raise ModelError("the server closed the stream before the response finished")
        if reply.finish_reason != "cancelled" and kind == "answer":
            self.session.usage = reply.usage
            self.estimator.calibrate(
                sum(compaction.message_chars(m) for m in messages), reply.usage.prompt_tokens
            )
        self.observer.on_generation_end(reply.usage)
        return reply

    def _extension(self, kind: str) -> dict[str, Any] | None:
        """Cache hints for kvserve (docs/agent.md): the server may checkpoint this session's prefix
        (reason agent_session) and the system prompt (agent_system) so a resumed session skips prefill;
        and prefill progress in the stream, for the status bar. A compaction summary's request is no
        prefix of any later prompt, so it asks for no session checkpoint."""
        if not self.config.is_kvserve:
            return None
        extension: dict[str, Any] = {
            "session_id": self.session.name,
            "system_checkpoint": "agent_system",
            "prefill_progress": True,
        }
        if kind == "answer":
            extension["checkpoint"] = "agent_session"
        return extension

    # --- compaction ---------------------------------------------------------------------------

    def compact(self, keep_tail: bool = True) -> bool:
        """Summarizes everything before the verbatim tail (all of it with `keep_tail` False); False if
        there was nothing to compact or the summary was cancelled (the conversation is then unchanged)."""
        messages = self.session.messages
        ctx = self.config.context_length
        start = compaction.tail_start(messages, ctx, self.estimator) if keep_tail else len(messages)
        head, tail = messages[:start], messages[start:]
        if len(head) <= 1:
            self.observer.on_notice("nothing to compact")
            return False
        request = [*head, Message("user", prompts.COMPACTION_REQUEST, is_internal=True)]
        budget = compaction.summary_budget(ctx)
        if not keep_tail or self.estimator.tokens(request) + budget > ctx:
            request = [_elided(m) for m in request]
        self.observer.on_notice(f"compacting: summarizing {len(head) - 1} messages, keeping {len(tail)}")
        reply = self._generate(request, "summary", budget)
        if reply.finish_reason == "cancelled":
            return False
        jobs = [job.status_line() for job in self.toolbox.jobs.running()]
        summary = reply.content or reply.reasoning or "(the model wrote no summary)"
        self.session.messages = compaction.compacted(messages[0], summary, tail, jobs)
        self.session.num_compactions += 1
        self.session.usage = Usage()
        self.num_counted = 0
        return True


def _merged(first: Message, second: Message) -> Message:
    return replace(
        second,
        content=first.content + second.content,
        reasoning=first.reasoning + second.reasoning,
        tool_calls=first.tool_calls + second.tool_calls,
    )


def _elided(message: Message) -> Message:
    if message.role != "tool" or (len(message.content) <= ELIDED_TOOL_CHARS and not message.image):
        return message
    content = message.content
    if len(content) > ELIDED_TOOL_CHARS:
        content = content[:ELIDED_TOOL_CHARS] + "\n[… elided for compaction]"
    return replace(
        message, content=content + ("\n[image elided for compaction]" if message.image else ""), image=None
    )
