"""A scripted model behind the real kvserve HTTP app: the FakeEngine answers from a list of replies
(Hermes `<tool_call>` markup becomes native tool calls through the server's own parser), and a
compaction request gets a fixed summary. Each prompt the model saw is kept for assertions."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.cli.embedded import serve_in_thread
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.segmenter import OutputSyntax
from tests.api.fake_engine import ByteTokenizer, FakeEngine, FakeTokenizerInfo, reply
from tests.api.test_images import VISION_TEMPLATE

SUMMARY = "SUMMARY: the user asked for things; files were read."


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@dataclass
class Script:
    replies: list[str]
    prompts: list[str] = field(default_factory=list)
    num_summaries: int = 0

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        text = ByteTokenizer().decode(prompt_ids, skip_special_tokens=False)
        self.prompts.append(text)
        last_user = text.rsplit("<|im_start|>user", 1)[-1]
        if "context compaction request" in last_user:
            self.num_summaries += 1
            return reply(SUMMARY)
        if not self.replies:
            return reply("(script exhausted)")
        return reply(self.replies.pop(0))


@dataclass
class ScriptedServer:
    url: str
    engine: FakeEngine
    script: Script


@contextlib.contextmanager
def scripted_server(
    replies: list[str],
    ctx: int = 8192,
    token_delay_s: float = 0.0,
    fail_after: int | None = None,
    num_prefill_chunks: int = 0,
    chunk_delay_s: float = 0.0,
    supports_images: bool = False,
) -> Iterator[ScriptedServer]:
    """`num_prefill_chunks` progress outputs `chunk_delay_s` apart before each reply's first token;
    `supports_images`: a vision model, whose prompt writes each image as `<image>`."""
    script = Script(list(replies))
    engine = FakeEngine(
        script,
        token_delay_s=token_delay_s,
        fail_after=fail_after,
        num_prefill_chunks=num_prefill_chunks,
        chunk_delay_s=chunk_delay_s,
    )
    syntax = OutputSyntax.detect(None, "hermes")
    settings = ChatServiceSettings(
        model_name="scripted",
        max_model_len=ctx,
        segmenter_factory=syntax.segmenter,
        supports_images=supports_images,
    )
    tokenizer = FakeTokenizerInfo(chat_template=VISION_TEMPLATE if supports_images else None)
    service = ChatService(engine, tokenizer, settings)
    app = create_app(service, ApiSettings(served_model_name="scripted"))
    with serve_in_thread(app) as (url, _server):
        yield ScriptedServer(url, engine, script)
