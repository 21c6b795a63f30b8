"""ChatService's rendered-text prefix lookup: a stored checkpoint's exact tokens + the rest."""

from __future__ import annotations

from kvserve.chat.conversation import ChatRequest, Message, TextPart
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply

STORED = [7, 7, 7]  # not what tokenizing the text gives: the lookup's tokens must be used as they are


def _chat(text: str) -> ChatRequest:
    return ChatRequest(messages=(Message("user", (TextPart(text),)),))


def test_prompt_is_the_stored_tokens_plus_the_tokenized_rest() -> None:
    plain = ChatService(
        FakeEngine(reply("x")),
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=4096),
    )
    rendered = plain.render(_chat("héllo there, a longer prompt"))
    cut = rendered.index("there")
    seen: list[str] = []

    def lookup(text: str) -> tuple[list[int], int] | None:
        seen.append(text)
        return (STORED, len(rendered[:cut].encode())) if text.startswith(rendered[:cut]) else None

    service = ChatService(
        FakeEngine(reply("x")),
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=4096),
        prompt_prefix=lookup,
    )
    prepared = service.prepare_chat(_chat("héllo there, a longer prompt"))
    assert seen == [rendered]
    assert prepared.prompt_token_ids == STORED + plain.tokenize(rendered[cut:], add_special_tokens=False)
    other = service.prepare_chat(_chat("something else"))  # no stored prefix: plain tokenization
    assert other.prompt_token_ids == plain.prepare_chat(_chat("something else")).prompt_token_ids
