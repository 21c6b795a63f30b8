"""ChatService: ChatRequest -> prompt tokens -> engine -> GenerationEvents.

Two steps so the HTTP layer can answer mistakes before it commits to a stream:
`prepare_*` (sync, CPU-bound: render, tokenize, validate, raise RequestError) and
`generate` (async: run the engine and the output pipeline).
"""

from __future__ import annotations

import logging
import uuid
from array import array
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvserve.chat.conversation import (
    ChatRequest,
    GenerationOptions,
    SamplingOptions,
    ServerHints,
    TextRequest,
)
from kvserve.chat.detokenizer import IncrementalDetokenizer
from kvserve.chat.render import ChatRenderer, ChatTemplateError
from kvserve.chat.stop import StopMatcher
from kvserve.grammar.compiler import GrammarCompiler, tokenizer_factory
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.constraints import DecodingConstraints
from kvserve.serving.engine_protocol import (
    CheckpointHint,
    EngineClient,
    ImageInput,
    ImagePromptError,
    ImagePromptSpec,
    PromptImage,
    SamplingDefaults,
    SamplingParams,
    SamplingParamsError,
    TokenConstraint,
    TokenizerLike,
    engine_image_key,
)
from kvserve.serving.errors import ContextLengthExceededError, RequestError
from kvserve.serving.events import Failed, Finished, GenerationEvent, Usage
from kvserve.serving.generation_run import GenerationRun
from kvserve.serving.heartbeat import with_heartbeat
from kvserve.serving.live_sequences import LiveSequence, LiveSequences, request_fingerprint
from kvserve.serving.output_pipeline import OutputPipeline, PlainTextSegmenter
from kvserve.serving.prefill_progress import PrefillTracker
from kvserve.serving.request_recorder import RequestRecorder
from kvserve.serving.shared_state import LiveSequenceSaved, SharedState, ToolCallsSampled
from kvserve.serving.token_text import TokenTexts
from kvserve.serving.tool_continuation import (
    ContinuationWording,
    PromptTokens,
    continue_sequence,
    find_live_sequence,
    find_replayed_sequence,
    reuse_live_prefix,
)
from kvserve.serving.tool_memory import ToolReplayMemory, attach_replays

logger = logging.getLogger(__name__)

# OpenAI's bound on a logit_bias value; seeds are int64 (the engine's RNG takes no more).
MAX_LOGIT_BIAS = 100.0
SEED_RANGE = (-(2**63), 2**63 - 1)
# The parameters a request may leave to the server's defaults (SamplingOptions' names).
_DEFAULTED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
# Sampling the APIs have no field for: always the server's defaults (llama.cpp's DRY, HF's length decay).
_SERVER_ONLY = (
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "length_decay_start",
    "length_decay_factor",
)


# The disk tier's text lookup: the exact tokens of the stored checkpoint whose rendered text is the
# longest prefix of a prompt, and that prefix's length in UTF-8 bytes (engine.disk_tier.text_prefix).
PromptPrefixLookup = Callable[[str], "tuple[list[int], int] | None"]


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request, ready to queue."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | None  # None when max_tokens is 0: nothing to generate
    stop: tuple[str, ...]
    chat: ChatRequest | None = None  # None for raw-prompt completions: their output is not parsed
    prompt_text: str = ""  # the rendered prompt (chat requests)
    constraint: TokenConstraint | None = None  # grammar-constrained decoding (tool_choice, response_format)
    hints: ServerHints = field(default_factory=ServerHints)  # the `kvserve` extension field
    images: tuple[PromptImage, ...] = ()  # a vision model's images, with their spans in the prompt

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


class ChatService:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: TokenizerLike,
        settings: ChatServiceSettings,
        *,
        tool_memory: ToolReplayMemory | None = None,
        live_sequences: LiveSequences | None = None,
        prompt_prefix: PromptPrefixLookup | None = None,
        recorder: RequestRecorder | None = None,
    ):
        """`tool_memory` None turns exact tool replay off (--disable-exact-tool-replay); `live_sequences`
        None turns live tool continuation off; `prompt_prefix` None: no disk tier to look prompts up in."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.settings = settings
        self.tool_memory = tool_memory
        self.live_sequences = live_sequences
        self.prompt_prefix = prompt_prefix
        self.recorder = recorder or RequestRecorder()  # what the web console shows
        # Set by a server with several front ends (`serve --api-servers`): what this one remembers
        # for the next turn goes to the others too (`apply_shared` there).
        self.share: Callable[[SharedState], None] | None = None
        hf = tokenizer.tokenizer
        special = {
            name: getattr(hf, name)
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
            if isinstance(getattr(hf, name, None), str)
        }
        self.renderer = ChatRenderer(tokenizer.chat_template, special)
        self.token_texts = TokenTexts(hf)
        vocab_size = settings.vocab_size or len(hf)
        compiler = GrammarCompiler(tokenizer_factory(hf, vocab_size, tokenizer.eos_token_ids))
        self.constraints = DecodingConstraints(
            compiler, settings.tool_syntax, reasoning=settings.reasoning_syntax
        )

    # -- prepare (sync; run it off the event loop for long prompts) ---------------------

    def render(self, request: ChatRequest) -> str:
        self._check_images(request, "messages")
        if self.tool_memory is not None:
            request = attach_replays(request, self.tool_memory)
        try:
            return self.renderer.render(request)
        except ChatTemplateError as error:
            raise RequestError(str(error), param="messages") from error

    def prepare_chat(
        self,
        request: ChatRequest,
        param: str = "messages",
        request_id: str | None = None,
        continuation: ContinuationWording | None = None,
    ) -> PreparedRequest:
        """`continuation` (Responses, Anthropic) lets trailing tool results continue a live sequence."""
        self._check_images(request, param)
        spec = self.settings.image_prompt
        if spec is not None and any(m.has_images for m in request.messages):
            return self._prepare_with_images(request, spec, param, request_id)
        prompt = self._live_prompt(request, continuation) if continuation is not None else None
        prompt = prompt or self._replayed_prompt(request, self.render)  # later turns, Chat
        if prompt is None:
            text = self.render(request)
            prompt = reuse_live_prefix(text, request.messages, self.live_sequences, self._tokenize_rest)
            prompt = prompt or PromptTokens(self.prompt_tokens(text), text)
        prepared = self._prepare(
            prompt.token_ids, request.options, param, request_id, chat=request, prompt_text=prompt.text
        )
        return self._constrained(prepared, lambda: self.constraints.for_chat(request, prompt.text))

    def _prepare_with_images(
        self, request: ChatRequest, spec: ImagePromptSpec, param: str, request_id: str | None
    ) -> PreparedRequest:
        """A vision model's prompt: each image placeholder the template wrote expanded into the
        image's tokens (the family's `ImagePromptSpec`), then each image's span found in the tokens.
        The prefix cache and the disk tier find earlier turns by the chain hashes, which carry every
        image's content hash. A history that replays a live tool-call turn continues that turn's
        exact token ids (as text prompts do); output-only tool results (no calling turn, so no
        earlier images) are rendered."""
        images = self.renderer.images(request)

        def render(chat: ChatRequest) -> str:
            return spec.expand(self.render(chat), self.renderer.images(chat))

        try:
            prompt = self._replayed_prompt(request, render)
            if prompt is None:
                text = render(request)
                prompt = reuse_live_prefix(text, request.messages, self.live_sequences, self._tokenize_rest)
                prompt = prompt or PromptTokens(self.prompt_tokens(text), text)
            spans = spec.spans(prompt.token_ids, images)
        except ImagePromptError as error:
            raise RequestError(f"the prompt's images: {error}", param=param) from None
        prepared = self._prepare(
            prompt.token_ids, request.options, param, request_id, chat=request, prompt_text=prompt.text
        )
        prepared = replace(prepared, images=tuple(spans))
        return self._constrained(prepared, lambda: self.constraints.for_chat(request, prompt.text))

    def _check_images(self, request: ChatRequest, param: str) -> None:
        if not self.settings.supports_images and any(m.has_images for m in request.messages):
            raise RequestError(
                f"the model {self.settings.model_name!r} does not accept image inputs (it has no vision)",
                param=param,
            )

    def _replayed_prompt(
        self, request: ChatRequest, render: Callable[[ChatRequest], str]
    ) -> PromptTokens | None:
        """A history that replays a live tool-call turn, all before it unchanged: that turn's exact
        tokens + the rendered tail (its results), whatever the template writes for the turn itself.
        Part of exact tool replay: off with it (--disable-exact-tool-replay renders canonically)."""
        if self.tool_memory is None:
            return None
        found = find_replayed_sequence(request, self.live_sequences)
        if found is None:
            return None
        cut, sequence = found
        return continue_sequence(request, cut, sequence, render, self._tokenize_rest)

    def _live_prompt(self, request: ChatRequest, wording: ContinuationWording) -> PromptTokens | None:
        found = find_live_sequence(request, wording, self.live_sequences, self.tool_memory)
        if found is None:
            return None
        cut, sequence = found
        prompt = continue_sequence(request, cut, sequence, self.render, self._tokenize_rest)
        if prompt is None and cut.calling_turn is None:
            raise wording.gone()  # nothing else to render the calls from
        if prompt is not None:
            logger.debug("tool results continue a live sequence of %d tokens", len(sequence.token_ids))
        return prompt

    def prompt_tokens(self, text: str) -> list[int]:
        """Tokens of a rendered prompt. When a stored checkpoint's text prefixes it, that
        checkpoint's exact tokens (as sampled: BPE boundaries differ from a re-tokenization)
        + the tokens of the rest, so the engine finds its KV."""
        found = self.prompt_prefix(text) if self.prompt_prefix is not None else None
        if found is None:
            return self.tokenize(text, add_special_tokens=False)
        stored, num_bytes = found
        rest = text.encode()[num_bytes:].decode()
        logger.debug("prompt: %d tokens of a stored checkpoint + %d chars", len(stored), len(rest))
        return stored + self.tokenize(rest, add_special_tokens=False)

    def prepare_text(
        self, request: TextRequest, param: str = "prompt", request_id: str | None = None
    ) -> PreparedRequest:
        token_ids = self.tokenize(request.prompt, add_special_tokens=True)
        prepared = self._prepare(token_ids, request.options, param, request_id)
        return self._constrained(prepared, lambda: self.constraints.for_text(request))

    @staticmethod
    def _constrained(
        prepared: PreparedRequest, constraint: Callable[[], TokenConstraint | None]
    ) -> PreparedRequest:
        """Built even when max_tokens is 0 (a bad schema is a 400 regardless); attached only when
        something will run."""
        built = constraint()
        return prepared if built is None or prepared.params is None else replace(prepared, constraint=built)

    def _tokenize_rest(self, text: str) -> list[int]:
        return self.tokenize(text, add_special_tokens=False)

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """Tokens of `text`; with add_special_tokens, BOS is prepended where the model wants it."""
        token_ids = list(self.tokenizer.tokenizer.encode(text, add_special_tokens=False))
        bos = self.tokenizer.bos_token_id
        if add_special_tokens and self.tokenizer.add_bos_token and bos is not None:
            token_ids.insert(0, bos)
        return token_ids

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _prepare(
        self,
        token_ids: list[int],
        options: GenerationOptions,
        param: str,
        request_id: str | None,
        chat: ChatRequest | None = None,
        prompt_text: str = "",
    ) -> PreparedRequest:
        if not token_ids:
            raise RequestError("the prompt is empty", param=param)
        max_model_len, max_tokens_limit = self.settings.max_model_len, self.settings.max_tokens_limit
        if len(token_ids) >= max_model_len:
            raise ContextLengthExceededError(len(token_ids), max_model_len, param)
        room = max_model_len - len(token_ids)
        if max_tokens_limit is not None:
            room = min(room, max_tokens_limit)
        max_tokens = room if options.max_tokens is None else min(max(options.max_tokens, 0), room)
        params = self._sampling_params(options, max(max_tokens, 1))  # checked even if nothing runs
        # A fresh suffix keeps engine ids unique even when a client reuses its x-request-id.
        engine_id = f"{request_id}-{uuid.uuid4().hex[:8]}" if request_id else uuid.uuid4().hex
        params = params if max_tokens > 0 else None
        return PreparedRequest(
            engine_id, token_ids, params, options.stop, chat, prompt_text, hints=options.hints
        )

    def _sampling_params(self, options: GenerationOptions, max_tokens: int) -> SamplingParams:
        s = options.sampling
        self._check_sampling(s)
        defaults = self.settings.sampling_defaults
        if s.temperature == 0:
            # A request that asks for greedy gets the argmax, as llama-server gives it: the defaults'
            # penalties would change it (SmolLM2's preset took `kvserve eval`, all greedy, from 9 to
            # 5 of 59 answers right; docs/evals.md). Penalties the request sends still apply.
            defaults = SamplingDefaults()
        fields: dict[str, Any] = {
            name: getattr(defaults, name) if getattr(s, name) is None else getattr(s, name)
            for name in _DEFAULTED
        }
        # A window belongs to the default penalty (llama.cpp's penalty_last_n); a request's own
        # repetition_penalty has vLLM's meaning, over the whole sequence.
        fields["repetition_last_n"] = defaults.repetition_last_n if s.repetition_penalty is None else 0
        fields |= {name: getattr(defaults, name) for name in _SERVER_ONLY}
        fields |= {"seed": s.seed, "logprobs": s.logprobs}
        given = {k: v for k, v in fields.items() if v is not None}
        try:
            return SamplingParams(
                max_tokens=max_tokens, ignore_eos=s.ignore_eos, logit_bias=s.logit_bias, **given
            )
        except SamplingParamsError as error:
            # Its messages start with the field's name ("top_p must be in (0, 1]").
            raise RequestError(str(error), param=str(error).split(" ", 1)[0]) from error

    def _check_sampling(self, s: SamplingOptions) -> None:
        """What SamplingParams cannot know: the vocabulary, and the RNG's seed range."""
        if s.seed is not None and not SEED_RANGE[0] <= s.seed <= SEED_RANGE[1]:
            raise RequestError("seed must be a 64-bit signed integer", param="seed")
        vocab_size = len(self.tokenizer.tokenizer) if s.logit_bias else 0
        for token_id, bias in s.logit_bias:
            if not 0 <= token_id < vocab_size:
                raise RequestError(
                    f"logit_bias: token id {token_id} is outside the vocabulary [0, {vocab_size})",
                    param="logit_bias",
                )
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise RequestError(
                    f"logit_bias: values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
                    param="logit_bias",
                )

    # -- generate --------------------------------------------------------------------

    def _image_inputs(self, prepared: PreparedRequest) -> tuple[ImageInput, ...]:
        """The engine's inputs: the encoded images, which the engine tiles (0.1-0.35 s a SmolVLM
        image on a 2-core CPU) only when its encoder cache lacks them."""
        spec = self.settings.image_prompt
        assert spec is not None
        return tuple(
            ImageInput(
                engine_image_key(p.image, spec), p.offset, p.num_tokens, spec.tiles(p.image), grid=p.grid
            )
            for p in prepared.images
        )

    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[GenerationEvent]:
        """The event stream of one request. Closing it early aborts the engine request."""
        if prepared.params is None:  # max_tokens 0: nothing to run
            usage = Usage(prepared.num_prompt_tokens, 0, 0)
            for event in (usage, usage, Finished("length")):
                yield event
            return
        images = self._image_inputs(prepared) if prepared.images else ()
        run = self._new_run(prepared)
        image_keys = tuple((p.offset, p.image.content_hash) for p in prepared.images)
        self.recorder.start(prepared.request_id, prepared.prompt_token_ids, run, image_keys)
        outputs = self.engine.generate(
            prepared.request_id,
            prepared.prompt_token_ids,
            prepared.params,
            constraint=prepared.constraint,
            checkpoint_hint=_checkpoint_hint(prepared.hints),
            images=images,
        )
        beats = with_heartbeat(outputs, self.settings.keepalive_s, until=lambda: run.prefill.is_done)
        try:
            async for output in beats:
                for event in run.tick() if output is None else run.push(output):
                    yield event
                if run.is_done:
                    break
        except Exception as error:  # the engine boundary: a failure ends this stream only
            logger.exception("request %s failed in the engine", prepared.request_id)
            yield Failed(f"generation failed: {error}")
            return
        finally:
            await _aclose(beats)
            await _aclose(outputs)
            self.recorder.end(prepared.request_id)
        closing = run.finish()
        self._remember_tool_calls(prepared, run, closing)  # before the client can send the results
        for event in closing:
            yield event

    def _new_run(self, prepared: PreparedRequest) -> GenerationRun:
        assert prepared.params is not None
        pipeline = OutputPipeline(
            IncrementalDetokenizer(self.tokenizer.tokenizer, prepared.prompt_token_ids),
            StopMatcher(prepared.stop),
            PlainTextSegmenter()
            if prepared.chat is None
            else self.settings.segmenter_factory(prepared.chat, prepared.prompt_text),
        )
        prefill = PrefillTracker(
            prepared.request_id, prepared.num_prompt_tokens, reports=prepared.hints.prefill_progress
        )
        wants_logprobs = prepared.params.logprobs is not None
        token_texts = self.token_texts if wants_logprobs else None
        return GenerationRun(pipeline, prefill, token_texts, self.tokenizer.eos_token_ids)

    def _remember_tool_calls(
        self, prepared: PreparedRequest, run: GenerationRun, closing: list[GenerationEvent]
    ) -> None:
        """Feed tool replay memory with the calls' sampled text, and keep the exact sequence of a turn
        that ended in tool calls for live continuation."""
        blocks = run.pipeline.segmenter.sampled_blocks
        if not blocks or prepared.chat is None:
            return
        if self.tool_memory is not None:
            self.tool_memory.remember(blocks)
            if self.share is not None:
                self.share(ToolCallsSampled(tuple(blocks)))
        finished = closing[-1] if closing else None
        if (
            self.live_sequences is None
            or not isinstance(finished, Finished)
            or finished.reason != "tool_calls"
        ):
            return
        output = run.output_token_ids
        end_text = (
            self.detokenize(output[-1:]) if output[-1:] and output[-1] in self.tokenizer.eos_token_ids else ""
        )
        sequence = LiveSequence(
            call_ids=tuple(call_id for _, ids in blocks for call_id in ids),
            token_ids=array("i", prepared.prompt_token_ids + output),
            text=prepared.prompt_text + self.detokenize(output),
            end_text=end_text,
            fingerprint=request_fingerprint(prepared.chat, prepared.chat.messages),
        )
        self.live_sequences.save(sequence)
        if self.share is not None:
            self.share(LiveSequenceSaved(sequence))

    def apply_shared(self, message: SharedState) -> None:
        """What another front end of this server remembered (`share`): the next turn of its
        conversation may come here."""
        match message:
            case ToolCallsSampled(blocks) if self.tool_memory is not None:
                self.tool_memory.remember(blocks)
            case LiveSequenceSaved(sequence) if self.live_sequences is not None:
                self.live_sequences.save(sequence)


def _checkpoint_hint(hints: ServerHints) -> CheckpointHint | None:
    if not (hints.save_session or hints.save_system):
        return None
    return CheckpointHint(hints.session_id, save_system=hints.save_system, save_session=hints.save_session)


async def _aclose(iterator: AsyncIterator[object]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()
