"""The serving path's host cost per streamed token, with an engine that costs nothing but its step time.

`kvserve serve`'s real app (ChatService, AsyncEngineClient and its engine thread, uvicorn) over a fake
EngineCore whose `step()` sleeps `--step-ms` (the GIL released, like a CUDA wait) and then emits one
token for every running request. Whatever keeps HTTP throughput below `streams / step time` is host
work on the serving side. `--cprofile FILE` profiles the event loop (the main thread) until SIGTERM.

    python scripts/serve_host_profile.py --tokenizer TOKDIR --port 8140 --step-ms 3 [--cprofile out.prof]
    kvserve bench serve --url http://127.0.0.1:8140 --model TOKDIR --max-concurrency 256 --client-procs 4 ...
"""

from __future__ import annotations

import argparse
import cProfile
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import FinishReason


@dataclass
class _Request:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    num_output_tokens: int = 0


@dataclass
class FakeStepCore:
    """What AsyncEngineClient calls on EngineCore; token ids cycle over ordinary vocabulary."""

    step_s: float
    running: dict[str, _Request] = field(default_factory=dict)
    num_steps: int = 0

    def make_request(self, request_id, prompt_token_ids, params, constraint=None, checkpoint_hint=None):  # type: ignore[no-untyped-def]
        return _Request(request_id, len(prompt_token_ids), params.max_tokens)

    def add_request(self, request: _Request) -> None:
        self.running[request.request_id] = request

    def abort_request(self, request_id: str) -> None:
        self.running.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list[EngineOutput]:
        time.sleep(self.step_s)
        self.num_steps += 1
        outputs = []
        for request in list(self.running.values()):
            request.num_output_tokens += 1
            done = request.num_output_tokens >= request.max_tokens
            if done:
                del self.running[request.request_id]
            token_id = 300 + (request.num_output_tokens * 7 + self.num_steps) % 20000
            outputs.append(
                EngineOutput(
                    request.request_id,
                    (token_id,),
                    finish_reason=FinishReason.LENGTH if done else None,
                    num_prompt_tokens=request.num_prompt_tokens,
                )
            )
        return outputs

    def shutdown(self) -> None:
        pass


@dataclass(frozen=True)
class _TokenizerInfo:
    tokenizer: object
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos_token: bool = False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--port", type=int, default=8140)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--cprofile", type=Path, default=None)
    args = p.parse_args()

    import uvicorn
    from transformers import AutoTokenizer

    from kvserve.api.app import create_app
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings

    hf = AutoTokenizer.from_pretrained(args.tokenizer)
    info = _TokenizerInfo(hf, hf.chat_template, hf.bos_token_id, (hf.eos_token_id,))
    engine = AsyncEngineClient(FakeStepCore(args.step_ms / 1000))  # type: ignore[arg-type]
    app = create_app(ChatService(engine, info, ChatServiceSettings(model_name="fake", max_model_len=8192)))
    server = uvicorn.Server(uvicorn.Config(app, port=args.port, log_level="warning", access_log=False))
    profile = cProfile.Profile() if args.cprofile else None
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    if profile is not None:
        profile.enable()
    try:
        server.run()
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.cprofile)
        engine.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
