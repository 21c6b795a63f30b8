"""`bench multiturn --image-turns 1,3` against the real API over a FakeEngine on a live port: both APIs
accept the screenshots, and every later turn resends them with its history."""

from __future__ import annotations

import pytest

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.bench.client import Api
from kvserve.bench.multiturn import MultiturnBench, MultiturnConfig, MultiturnTarget
from kvserve.chat.conversation import ChatRequest, ImagePart, TextPart
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.conftest import MODEL
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.api.test_images import VISION_TEMPLATE
from tests.live_uvicorn import serve_in_thread
from tests.unit.bench.char_tokenizer import CharTokenizer


@pytest.mark.parametrize("api", [Api.CHAT, Api.ANTHROPIC])
def test_image_turns_reach_the_server_with_their_history(api: Api) -> None:
    settings = ChatServiceSettings(model_name=MODEL, max_model_len=8192, supports_images=True)
    service = ChatService(FakeEngine(reply("ok")), FakeTokenizerInfo(chat_template=VISION_TEMPLATE), settings)
    requests: list[ChatRequest] = []
    render = service.render

    def recording(request: ChatRequest) -> str:
        requests.append(request)
        return render(request)

    service.render = recording  # type: ignore[method-assign]
    config = MultiturnConfig(
        num_agents=2,
        num_turns=4,
        prefix_tokens=200,
        user_tokens=20,
        output_tokens=2,
        image_turns=(1, 3),
        image_size=(160, 90),
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name=MODEL))) as (url, _):
        target = MultiturnTarget(url, MODEL, api)
        results = MultiturnBench(target, CharTokenizer(), config, progress=False).run()
    assert all(r.result.is_success for r in results), [r.result.error for r in results]
    assert [(r.turn, r.num_images) for r in results if r.agent == 0] == [(1, 1), (2, 0), (3, 1), (4, 0)]
    hashes: dict[int, list[list[str]]] = {}  # per agent, per turn: the request's images in order
    for request in requests:
        users = [m for m in request.messages if m.role == "user"]
        first = next(p for p in users[0].parts if isinstance(p, TextPart)).text
        agent = int(first.split(":")[0].removeprefix("Agent "))
        images = [p.image for m in users for p in m.parts if isinstance(p, ImagePart)]
        assert all((i.width, i.height, i.media_type) == (160, 90, "image/png") for i in images)
        assert isinstance(users[0].parts[0], ImagePart)  # the screenshot comes before the turn's text
        hashes.setdefault(agent, []).append([i.content_hash for i in images])
    assert sorted(hashes) == [0, 1]
    for per_turn in hashes.values():
        assert [len(h) for h in per_turn] == [1, 1, 2, 2]  # turn 1's image, resent; then turn 3's too
        assert per_turn[0] == per_turn[1] == per_turn[2][:1] and per_turn[2] == per_turn[3]
        assert per_turn[2][1] != per_turn[2][0]
    assert hashes[0][0] != hashes[1][0]  # each agent has its own screenshots
