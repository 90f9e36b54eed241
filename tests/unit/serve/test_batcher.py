"""The server's batches hold the source tokens their Request allows (`Request.line_budget`, the
library's own rule): an unset beam counts as the decode.beam it becomes, not as 1."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from attn_mt.config.schema import DecodeConfig
from attn_mt.data.batching import length_batches
from attn_mt.decode.request import Request
from attn_mt.decode.search import Sampling
from attn_mt.serve.batcher import WIDEST, Batcher, Job

LINE_TOKENS = 8  # each line's source tokens with its <eos>


@pytest.mark.parametrize(
    ("asked", "budget"),
    [
        (Request(), 2 * 60 // (5 + 1)),  # no beam given: decode.beam's 5, (K + 1) / 2 rows a line
        (Request(beam=1), 60),
        (Request(nbest=3, sampling=Sampling()), 60 // 3),  # each sample a row of its own
    ],
    ids=["unset-beam", "greedy", "three-samples"],
)
def test_a_batch_holds_the_source_tokens_its_request_allows(asked: Request, budget: int) -> None:
    request = replace(asked, batch_tokens=60).resolved(DecodeConfig(beam=5), vocab=100)
    assert request.line_budget() == budget
    batches: list[list[str]] = []

    def decode(_model, lines: list[str], _request) -> list[list[str]]:
        batches.append(lines)
        return [[line] for line in lines]

    batcher = Batcher(decode, max_wait_ms=0)
    lines = [f"line {i}" for i in range(9)]
    futures = [batcher.submit(Job(lines, request, None, None, [LINE_TOKENS] * 9)) for _ in (1, 2)]
    batcher.start()
    try:
        assert [f.result(timeout=60) for f in futures] == [[[line] for line in lines]] * 2
    finally:
        batcher.stop()
    assert max(len(batch) for batch in batches) == budget // LINE_TOKENS  # full, not over


def test_a_steered_request_is_decoded_a_line_at_a_time_between_others() -> None:
    """Terms, a prefix or avoided words make a slower search: such a job goes a line a batch
    and to the back of the queue after each, so a plain request queued after it waits for one
    line of it, not all."""
    request = Request(batch_tokens=1000).resolved(DecodeConfig(beam=2), vocab=100)
    steered = Job(["s1", "s2", "s3"], request, [["t"], ["t"], ["t"]], None, [4] * 3)
    avoiding = Job(["a1", "a2"], replace(request, avoid=("x",)), None, None, [4] * 2)
    plain = Job(["p1", "p2"], request, None, None, [4] * 2)
    batches: list[list[str]] = []

    def decode(_model, lines: list[str], _request) -> list[list[str]]:
        batches.append(lines)
        return [[line] for line in lines]

    batcher = Batcher(decode, max_wait_ms=0)
    futures = [batcher.submit(job) for job in (steered, avoiding, plain)]
    batcher.start()
    try:
        assert [f.result(timeout=60) for f in futures][2] == [["p1"], ["p2"]]
    finally:
        batcher.stop()
    assert batches == [["s1"], ["a1"], ["p1", "p2"], ["s2"], ["a2"], ["s3"]]


def test_jobs_of_two_models_are_never_decoded_together() -> None:
    request = Request(batch_tokens=1000).resolved(DecodeConfig(beam=2), vocab=100)
    jobs = [Job([f"{m}{i}" for i in range(2)], request, None, None, [4] * 2, m) for m in "ab"]
    batches: list[tuple[str, list[str]]] = []

    def decode(model, lines: list[str], _request) -> list[list[str]]:
        batches.append((model, lines))
        return [[line] for line in lines]

    batcher = Batcher(decode, max_wait_ms=0)
    futures = [batcher.submit(job) for job in jobs]
    batcher.start()
    try:
        [f.result(timeout=60) for f in futures]
    finally:
        batcher.stop()
    assert batches == [("a", ["a0", "a1"]), ("b", ["b0", "b1"])]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_says_when_the_decode_worker_is_down() -> None:
    """/health answers 503 once the worker thread has ended, and a request 503 too, not a
    wait for ever."""
    from fastapi.testclient import TestClient

    from attn_mt.serve.app import create_app
    from attn_mt.serve.batcher import Call
    from attn_mt.serve.service import Limits, Service

    service = Service([], Limits(), max_batch_tokens=10, max_wait_ms=0)
    with TestClient(create_app(service)) as client:
        assert client.get("/health").json() == {"status": "ok"}

        def end_the_worker() -> None:
            raise SystemExit  # not an Exception: nothing on the worker catches it

        service.batcher.submit(Call(end_the_worker))
        service.batcher._thread.join(timeout=30)
        down = client.get("/health")
        assert down.status_code == 503 and "worker is down" in down.json()["error"]
        refused = client.post("/v1/attention", json={"text": "qb"})
        assert refused.status_code in (422, 503)


def test_a_batch_of_mixed_lengths_is_searched_as_one() -> None:
    """The lines a batch takes (their summed tokens within the budget) reach the library with a
    budget that holds their padded size, so it searches them in one batch, not in the length
    buckets it would cut them into; the request is otherwise the same."""
    request = Request(batch_tokens=90).resolved(DecodeConfig(beam=5), vocab=100)
    sizes = [2, 3, 18, 2, 4]  # 29 tokens, within the budget of 30; padded 5 x 18 = 90
    assert len(length_batches([(s,) for s in sizes], request.line_budget())) > 1
    seen: list[tuple[list[str], Request]] = []

    def decode(_model, lines: list[str], asked: Request) -> list[list[str]]:
        seen.append((lines, asked))
        return [[line] for line in lines]

    batcher = Batcher(decode, max_wait_ms=0)
    lines = [f"line {i}" for i in range(5)]
    future = batcher.submit(Job(lines, request, None, None, sizes))
    batcher.start()
    try:
        future.result(timeout=60)
    finally:
        batcher.stop()
    [(taken, asked)] = seen
    assert taken == lines
    assert len(length_batches([(s,) for s in sizes], asked.line_budget())) == 1
    assert replace(asked, batch_tokens=request.batch_tokens, first_line=1) == request


def test_a_batch_is_widened_no_further_than_a_few_budgets() -> None:
    """Many short lines beside one long one would pad to a large batch: past WIDEST budgets,
    the library cuts them as it would (memory stays bounded)."""
    request = Request(batch_tokens=300).resolved(DecodeConfig(beam=5), vocab=100)
    sizes = [1] * 40 + [60]  # 100 tokens, the budget's; padded 41 x 60, past 4 budgets
    seen: list[Request] = []

    def decode(_model, lines: list[str], asked: Request) -> list[list[str]]:
        seen.append(asked)
        return [[line] for line in lines]

    batcher = Batcher(decode, max_wait_ms=0)
    future = batcher.submit(Job([f"l{i}" for i in range(41)], request, None, None, sizes))
    batcher.start()
    try:
        future.result(timeout=60)
    finally:
        batcher.stop()
    [asked] = seen  # one batch of the batcher's
    assert asked.batch_tokens == WIDEST * 300


def test_on_worker_runs_on_the_decode_thread_and_hands_back_its_result_or_error() -> None:
    """The server loads and warms its models with `on_worker`: on the thread that decodes (a
    second thread that computes would get a thread pool of its own; module docstring)."""

    def decode(_model, lines: list[str], _request) -> list[list[str]]:
        return [[line] for line in lines]

    batcher = Batcher(decode, max_wait_ms=0)
    try:
        assert batcher.on_worker(lambda: threading.current_thread().name) == "attn-mt-decode"
        assert batcher.on_worker(lambda: 7) == 7  # started once, reused
        with pytest.raises(ZeroDivisionError):
            batcher.on_worker(lambda: 1 / 0)
        batcher.start()  # as the server's start-up does again: no second thread
        assert batcher.on_worker(threading.get_ident) == batcher.on_worker(threading.get_ident)
    finally:
        batcher.stop()


def test_the_service_worker_sizes_its_threads_before_each_batch(monkeypatch) -> None:
    """`new_worker`'s decode asks its ThreadSizer before every batch, on the worker thread (the
    thread whose OpenMP threads the count sets)."""
    from attn_mt.serve import service

    asked: list[str] = []

    class Sizer:
        def __init__(self, *_args) -> None:
            pass

        def adjust(self) -> int:
            asked.append(threading.current_thread().name)
            return 1

    class Translator:
        def translate_nbest(self, lines, _request):
            return [[line] for line in lines]

    monkeypatch.setattr(service, "ThreadSizer", Sizer)
    request = Request(batch_tokens=1000).resolved(DecodeConfig(beam=2), vocab=100)
    batcher = service.new_worker(max_wait_ms=0)
    batcher.start()
    model = Translator()
    try:
        for text in ("a", "b"):
            job = Job([text], request, None, None, [2], model)
            assert batcher.submit(job).result(timeout=60) == [[text]]
    finally:
        batcher.stop()
    assert asked == ["attn-mt-decode"] * 2
