"""RequestRecorder (bounded ring, token budget, hit-rate buckets, live snapshots) and the prompt
divergence finder, on fake runs: no engine, no HTTP."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from kvserve.serving.prompt_divergence import DivergenceFinder, common_prefix_len, first_image_difference
from kvserve.serving.request_recorder import PromptSource, RequestRecorder


@dataclass
class FakePrefill:
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    is_done: bool = False
    elapsed_s: float | None = None


@dataclass
class FakeRun:
    prefill: FakePrefill
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished_run(num_prompt: int, num_cached: int, num_output: int = 3) -> FakeRun:
    prefill = FakePrefill(num_prompt, num_prompt, num_cached, is_done=True, elapsed_s=0.05)
    return FakeRun(prefill, num_cached, num_output, "stop")


def record(recorder: RequestRecorder, request_id: str, tokens: list[int], cached: int = 0) -> None:
    recorder.start(request_id, tokens, finished_run(len(tokens), cached))  # type: ignore[arg-type]
    recorder.end(request_id)


def test_ring_keeps_the_newest_records_and_a_cursor() -> None:
    recorder = RequestRecorder(max_records=3)
    for i in range(5):
        record(recorder, f"r{i}", [1, 2, i])
    assert [r.request_id for r in recorder.recent()] == ["r2", "r3", "r4"]
    assert [r.seq for r in recorder.recent(after_seq=3)] == [4, 5]
    assert recorder.recent(after_seq=5) == []
    assert [r.request_id for r in recorder.recent(limit=1)] == ["r4"]
    assert recorder.get("r0") is None and recorder.get("r3") is not None
    assert recorder.last_seq == 5


def test_token_budget_drops_the_oldest_prompts_first() -> None:
    recorder = RequestRecorder(max_records=10, max_kept_tokens=25)
    for i in range(4):
        record(recorder, f"r{i}", list(range(10)))
    kept = [r.prompt_token_ids is not None for r in recorder.recent()]
    assert kept == [False, False, True, True]
    assert all(r.num_prompt_tokens == 10 for r in recorder.recent())  # the summary stays


def test_source_and_outcome() -> None:
    recorder = RequestRecorder()
    recorder.start("disk", [1] * 40, finished_run(40, 32))  # type: ignore[arg-type]
    recorder.note_source("disk", PromptSource(16, 16, "abc"))
    recorder.note_source("unknown", PromptSource(1, 1))  # not in flight: ignored
    recorder.end("disk")
    record(recorder, "ram", [1] * 40, cached=16)
    record(recorder, "cold", [2] * 40)
    aborted = FakeRun(FakePrefill(40, 16))
    recorder.start("aborted", [3] * 40, aborted)  # type: ignore[arg-type]
    recorder.end("aborted")
    by_id = {r.request_id: r for r in recorder.recent()}
    assert (by_id["disk"].source, by_id["disk"].num_disk_tokens, by_id["disk"].checkpoint_id) == (
        "disk",
        16,
        "abc",
    )
    assert (by_id["ram"].source, by_id["cold"].source) == ("ram", "cold")
    assert (by_id["aborted"].outcome, by_id["aborted"].ttft_s) == ("aborted", None)
    assert by_id["disk"].outcome == "stop" and by_id["disk"].ttft_s == 0.05


def test_live_snapshot_reads_the_run_lazily() -> None:
    recorder = RequestRecorder()
    run = FakeRun(FakePrefill(100))
    recorder.start("a", list(range(100)), run)  # type: ignore[arg-type]
    assert recorder.live()[0].phase == "queued"
    recorder.note_source("a", PromptSource(32, 0))
    run.prefill.num_computed_tokens = 64
    snapshot = recorder.live()[0]
    assert (snapshot.phase, snapshot.num_computed_tokens, snapshot.num_cached_tokens) == ("prefill", 64, 32)
    run.prefill.is_done, run.num_cached_tokens, run.num_output_tokens = True, 32, 7
    assert (recorder.live()[0].phase, recorder.live()[0].num_output_tokens) == ("decode", 7)
    recorder.end("a")
    assert recorder.live() == []


def test_hit_rate_buckets() -> None:
    clock = Clock()
    recorder = RequestRecorder(bucket_s=10.0, max_buckets=2, clock=clock)
    record(recorder, "a", [1] * 100, cached=0)
    clock.now += 1
    record(recorder, "b", [1] * 100, cached=50)
    clock.now += 10
    record(recorder, "c", [1] * 100, cached=100)
    clock.now += 10
    record(recorder, "d", [1] * 100, cached=20)
    series = recorder.hit_rate_series()
    assert [(b.num_requests, b.num_prompt_tokens, b.num_cached_tokens) for b in series] == [
        (1, 100, 100),
        (1, 100, 20),
    ]
    assert series[1].start - series[0].start == 10.0


def test_common_prefix_len() -> None:
    a = array("i", range(5000))
    for cut in (0, 1, 2047, 4999):
        b = array("i", a)
        b[cut] = -1
        assert common_prefix_len(a, b) == cut
    assert common_prefix_len(a, a[:300]) == 300
    assert common_prefix_len(a, array("i")) == 0


def test_divergence_against_the_closest_earlier_prompt() -> None:
    recorder = RequestRecorder()
    clock = Clock()
    recorder._clock = clock  # started times order the candidates
    words = [
        "system",
        "you",
        "are",
        "terse",
        ".",
        "user",
        "what",
        "is",
        "the",
        "date",
        "?",
        "today",
        "is",
        "monday",
    ]
    other = ["system", "you", "are", "terse", ".", "user", "what", "is", "the", "time", "?", "now"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words + other + ["tuesday"]))}
    names = {i: w for w, i in vocab.items()}
    ids = lambda text: [vocab[w] for w in text]
    record(recorder, "first", ids(other))
    clock.now += 1
    record(recorder, "second", ids(words))
    clock.now += 1
    record(recorder, "third", ids(words[:-1] + ["tuesday"]))
    finder = DivergenceFinder(recorder, lambda t: " ".join(names[i] for i in t), context_tokens=3)
    first, second, third = recorder.recent()
    assert finder.find(first) is None  # nothing before it
    d = finder.find(second)
    assert d is not None and (d.token_index, d.reference_id) == (9, "first")
    assert (d.before, d.after, d.reference_after) == ("what is the", "date ? today", "time ? now")
    d = finder.find(third)
    assert d is not None and (d.reference_id, d.token_index, d.after, d.reference_after) == (
        "second",
        len(words) - 1,
        "tuesday",
        "monday",
    )
    assert finder.find(third) is d  # memoized


def test_divergence_prefers_the_loaded_checkpoint_when_it_matches_more() -> None:
    recorder = RequestRecorder()
    recorder.start("r", [1, 2, 3, 4, 5], finished_run(5, 4))  # type: ignore[arg-type]
    recorder.note_source("r", PromptSource(0, 4, "ck1"))
    recorder.end("r")
    finder = DivergenceFinder(recorder, lambda t: ",".join(map(str, t)), lambda cid: [1, 2, 3, 4, 9, 9])
    d = finder.find(recorder.recent()[0])
    assert d is not None
    assert (d.reference_kind, d.reference_id, d.token_index, d.after, d.reference_after) == (
        "checkpoint",
        "ck1",
        4,
        "5",
        "9,9",
    )


def test_divergence_at_the_first_token_of_a_changed_image() -> None:
    """Images render to the same placeholder tokens whatever their pixels: the point is where the
    first image that is not the same image at the same place starts."""
    recorder = RequestRecorder()
    clock = Clock()
    recorder._clock = clock
    tokens = [1, 2, 7, 7, 7, 3, 7, 7, 7, 4]  # two images of three tokens, at 2 and 6
    for request_id, images in (("a", ((2, "h1"), (6, "h2"))), ("b", ((2, "h1"), (6, "h3")))):
        recorder.start(request_id, tokens, finished_run(len(tokens), 0), images)  # type: ignore[arg-type]
        recorder.end(request_id)
        clock.now += 1
    recorder.start("c", tokens, finished_run(len(tokens), 0), ((2, "h1"), (6, "h3")))  # type: ignore[arg-type]
    recorder.end("c")
    finder = DivergenceFinder(recorder, lambda t: ",".join(map(str, t)))
    _, b, c = recorder.recent()
    d = finder.find(b)
    assert d is not None and (d.reference_id, d.token_index, d.after) == ("a", 6, "7,7,7,4")
    d = finder.find(c)
    assert d is not None and (d.reference_id, d.token_index) == ("b", len(tokens))  # the same images
    assert first_image_difference(((2, "h1"),), (), 10) == 2  # an image where the other has text
    assert first_image_difference(((2, "h1"),), ((2, "h9"),), 2) == 2  # past the token prefix: moot


def test_divergence_from_a_checkpoint_stops_at_an_image_past_the_cached_prefix() -> None:
    """A checkpoint's tokens carry no images: the cache hit, which is image-aware, bounds them."""
    tokens = [1, 2, 3, 4, 7, 7, 7, 5, 6]
    for cached, expected in ((4, 4), (8, 9)):  # the image at 4 missed / was loaded with its blocks
        recorder = RequestRecorder()
        recorder.start("r", tokens, finished_run(len(tokens), cached), ((4, "h1"),))  # type: ignore[arg-type]
        recorder.note_source("r", PromptSource(0, cached, "ck1"))
        recorder.end("r")
        finder = DivergenceFinder(recorder, lambda t: ",".join(map(str, t)), lambda cid: tokens)
        d = finder.find(recorder.recent()[0])
        assert d is not None and (d.reference_kind, d.token_index) == ("checkpoint", expected)
