"""One request's way from engine outputs to GenerationEvents (ChatService.generate drives it).

A token-less, unfinished output is prefill progress: it feeds the PrefillTracker and never
counts as the first token (no Usage, no content, no TTFT). The first output with tokens (or
the final one) ends the prefill and announces the cache hit in the first Usage.
"""

from __future__ import annotations

from kvserve.serving.engine_protocol import EngineFinishReason, EngineOutput
from kvserve.serving.events import Failed, Finished, FinishReason, GenerationEvent, Logprobs, Usage
from kvserve.serving.output_pipeline import OutputPipeline
from kvserve.serving.prefill_progress import PrefillTracker
from kvserve.serving.token_text import TokenTexts

_ENGINE_REASONS: dict[EngineFinishReason, FinishReason] = {
    EngineFinishReason.STOP: "stop",
    EngineFinishReason.LENGTH: "length",
}


def is_prefill_progress(output: EngineOutput) -> bool:
    return not output.new_token_ids and not output.finished


class GenerationRun:
    def __init__(
        self,
        pipeline: OutputPipeline,
        prefill: PrefillTracker,
        token_texts: TokenTexts | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ):
        """`token_texts` is given when the request asked for logprobs."""
        self.pipeline = pipeline
        self.prefill = prefill
        self.token_texts = token_texts
        self.eos_token_ids = eos_token_ids
        self.num_output_tokens = 0
        self.output_token_ids: list[int] = []  # what was sampled, in order (live continuation needs it)
        self.num_cached_tokens = 0
        self.num_cache_write_tokens = 0
        self.is_done = False  # no more outputs wanted: the engine finished or a stop string matched
        self._reason: FinishReason | None = None
        self._error: str | None = None  # the engine's reason for FinishReason.ERROR

    @property
    def finish_reason(self) -> FinishReason | None:
        """How the run ended ("stop", "length"); None while running, or when aborted or failed."""
        return self._reason

    def tick(self) -> list[GenerationEvent]:
        """A heartbeat: a keepalive event while the prompt is still prefilling."""
        return [] if self.prefill.is_done else [self.prefill.progress()]

    def push(self, output: EngineOutput) -> list[GenerationEvent]:
        if is_prefill_progress(output):
            return [self.prefill.progress()] if self.prefill.update(output) else []
        events: list[GenerationEvent] = []
        self.num_cache_write_tokens = max(self.num_cache_write_tokens, output.num_cache_write_tokens)
        if not self.prefill.is_done:
            self.num_cached_tokens = output.num_cached_tokens
            self.prefill.finish(output.num_cached_tokens)
            events.append(self._usage())
        self.num_output_tokens += len(output.new_token_ids)
        self.output_token_ids += output.new_token_ids
        events += self._logprobs(output)
        step = self.pipeline.push(output.new_token_ids)
        events += step.events
        if step.stopped:
            self.is_done, self._reason = True, "stop"
        elif output.finish_reason is not None:  # ABORT and ERROR map to None: the stream fails
            self.is_done, self._reason = True, _ENGINE_REASONS.get(output.finish_reason)
            if output.finish_reason == EngineFinishReason.ERROR:
                self._error = f"constrained decoding failed: {output.error}"
        return events

    def finish(self) -> list[GenerationEvent]:
        """The closing events, once the outputs have ended."""
        if self._reason is None:  # aborted, failed, or the stream ended without a finish
            return [Failed(self._error or "generation was aborted")]
        return [
            *self.pipeline.finish(),
            self._usage(),
            Finished(self.pipeline.finish_reason(self._reason), self.pipeline.matched_stop),
        ]

    def _logprobs(self, output: EngineOutput) -> list[GenerationEvent]:
        logprobs = output.new_logprobs
        if self.token_texts is None or not logprobs:
            return []
        if output.finish_reason == EngineFinishReason.STOP and logprobs[-1].token_id in self.eos_token_ids:
            logprobs = logprobs[:-1]  # the end-of-turn token is not part of the answer's text
        return [Logprobs(self.token_texts.logprobs(logprobs))] if logprobs else []

    def _usage(self) -> Usage:
        num_prompt, num_cached = self.prefill.num_prompt_tokens, self.num_cached_tokens
        # Disk writes of output tokens (a `continued` save during decode) are not prompt caching.
        written = min(self.num_cache_write_tokens, num_prompt - num_cached)
        return Usage(num_prompt, self.num_output_tokens, num_cached, written)
