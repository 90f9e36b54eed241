"""The server's batches hold the source tokens their Request allows (`Request.line_budget`, the
library's own rule): an unset beam counts as the decode.beam it becomes, not as 1."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attn_mt.config import DecodeConfig
from attn_mt.decode.request import Request
from attn_mt.decode.search import Sampling
from attn_mt.serve.batcher import Batcher, Job

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

    def decode(lines: list[str], *_) -> list[list[str]]:
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
