"""The engine pipe's messages (`kvserve/engine/ipc.py`): each crosses pickle whole, and each side's
dispatch refuses a message it does not know, without a model or a child process."""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import time
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvserve.cli import engine_host
from kvserve.engine import ipc
from kvserve.engine.client_protocol import EngineClient
from kvserve.engine.engine_process import EngineProcess
from kvserve.engine.image_input import ImageInput
from kvserve.engine.process_client import EngineLink
from kvserve.engine.request import CheckpointHint
from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar.constraint import ConstraintRecipe
from tests.api.fake_engine import FakeEngine

INFO = ipc.EngineInfo(None, 2048, 256, "/tmp/kv", 2)
MESSAGES = [
    ipc.AddRequest(
        "r1",
        [1, 2, 3],
        SamplingParams(temperature=0.0, max_tokens=4),
        ConstraintRecipe('start: "a"', "hermes"),
        CheckpointHint("s1", save_system=True),
    ),
    ipc.AbortRequest("r1"),
    ipc.Query(7, engine_host.CheckpointTokensQuery("c1")),
    ipc.Tell(("request_record", {"id": "r1"})),
    ipc.Gather(8, ("a question", 1)),
    ipc.PeerAnswer(3, {"requests": 2}),
    ipc.Shutdown(),
    ipc.Ready(INFO),
    ipc.StartFailed("kvserve: no such model"),
    ipc.RequestFailed("r1", ValueError("prompt token ids out of range")),
    ipc.Reply(7, [5, 6]),
    ipc.Reply(8, error=LookupError("no such query")),
    ipc.PromptSourceFound("r1", 64, 128, "c1"),
    ipc.Ask(4, ("a question", 1)),
    ipc.EngineDied("RuntimeError: boom"),
]
QUERIES = [
    engine_host.EngineStatsQuery(),
    engine_host.CacheViewQuery(),
    engine_host.CheckpointTokensQuery("c1"),
    engine_host.TextPrefixQuery("<|im_start|>system"),
    engine_host.SetTurnMarkers(((1, 2), (3,))),
]


def _comparable(value: object) -> object:
    """Exceptions compare by identity: compare them by type and arguments."""
    if isinstance(value, BaseException):
        return type(value), value.args
    return value


def _fields(message: typing.Any) -> list[object]:
    return [_comparable(getattr(message, f.name)) for f in dataclasses.fields(message)]


@pytest.mark.parametrize("message", MESSAGES + QUERIES, ids=lambda m: type(m).__name__)
def test_each_message_round_trips_through_pickle(message: object) -> None:
    wire = ipc.loads(ipc.dumps(message))  # type: ignore[arg-type]
    assert type(wire) is type(message) and _fields(wire) == _fields(message)


def test_images_cross_with_their_pixels() -> None:
    pixels = torch.randn(2, 3, 8, 8)
    add = ipc.AddRequest("r1", [1, 2], SamplingParams(), None, None, (ImageInput("h1", 1, 9, pixels),))
    (image,) = ipc.loads(ipc.dumps(add)).images  # type: ignore[attr-defined]
    assert (image.content_hash, image.offset, image.num_tokens) == ("h1", 1, 9)
    assert isinstance(image.pixel_values, torch.Tensor) and torch.equal(image.pixel_values, pixels)


def test_every_message_type_has_a_round_trip_example() -> None:
    declared = {
        t
        for union in (ipc.ToEngine, ipc.FromEngine, engine_host.EngineQuery)
        for t in typing.get_args(union)
        if dataclasses.is_dataclass(t)
    }
    assert declared == {type(m) for m in MESSAGES + QUERIES}
    for message_type in declared:
        params = message_type.__dataclass_params__  # type: ignore[attr-defined]
        assert params.frozen and "__slots__" in vars(message_type), message_type


def test_an_unknown_query_is_refused() -> None:
    core = SimpleNamespace(disk_tier=None)
    with pytest.raises(LookupError, match="unknown engine query"):
        engine_host.answer_query(core, "stats")  # type: ignore[arg-type]


def test_the_transports_are_engine_clients() -> None:
    assert isinstance(FakeEngine(), EngineClient)
    assert not isinstance(object(), EngineClient)


# -- the front end's side --------------------------------------------------------------------


def _wait_for(condition: typing.Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_front_end_refuses_an_unknown_message() -> None:
    mine, engines = multiprocessing.Pipe(duplex=True)
    engines.send_bytes(ipc.dumps(ipc.Ready(INFO)))
    link = EngineLink(mine, start_timeout=10)
    try:
        assert isinstance(link, EngineClient) and link.info == INFO
        with pytest.raises(ipc.UnknownMessageError, match="tuple"):
            link._handle(("reply", 0, True, None))
        dead: list[str] = []
        link.on_dead = dead.append
        engines.send_bytes(pickle.dumps(("dead", "a message of another protocol")))
        _wait_for(lambda: not link.is_running)
        assert dead == ["unknown message on the engine pipe: tuple"]
    finally:
        link.shutdown()
        engines.close()


def test_a_start_failure_or_a_stranger_fails_the_link_start() -> None:
    from kvserve.engine.process_client import EngineStartError

    for message, why in (
        (ipc.StartFailed("no such model"), "no such model"),
        (ipc.Shutdown(), "Shutdown before Ready"),
    ):
        mine, engines = multiprocessing.Pipe(duplex=True)
        engines.send_bytes(ipc.dumps(message))
        with pytest.raises(EngineStartError, match=why):
            EngineLink(mine, start_timeout=10)
        mine.close()
        engines.close()


# -- the engine's side -----------------------------------------------------------------------


def _fake_core() -> SimpleNamespace:
    """What `EngineProcess` reads of the core before any request."""
    loaded = SimpleNamespace(
        tokenizer=None,
        arch=SimpleNamespace(vocab_size=256, vision=None),
        path=Path("."),
        image_processor=None,
    )
    return SimpleNamespace(disk_tier=None, loaded=loaded, max_model_len=2048)


def test_the_engine_refuses_an_unknown_message() -> None:
    engines, front_end = multiprocessing.Pipe(duplex=True)
    process = EngineProcess(_fake_core(), None, [engines])  # type: ignore[arg-type]
    try:
        assert isinstance(ipc.loads(front_end.recv_bytes()), ipc.Ready)
        link = process.links[0]
        with pytest.raises(ipc.UnknownMessageError, match="tuple"):
            process.dispatch(link, ("abort", "r1"))
        process.inbox.put((0, ("abort", "r1")))  # type: ignore[arg-type]
        with pytest.raises(ipc.UnknownMessageError):
            process.apply_inbox(block=False)
        # Through the pipe: the link is closed, and link 0 closing shuts the engine down.
        front_end.send_bytes(pickle.dumps(("shutdown",)))
        assert process.apply_inbox(block=True) is False
        assert not link.is_open
    finally:
        process.flush()
        front_end.close()
        engines.close()
