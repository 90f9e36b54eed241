"""What one validation measures: the loss and perplexity by teacher forcing, the scores of the
search output, and a few samples to show (`validate`), in chunks under a time allowance
(`chunks`: as many sentences as the run's budget holds); a multilingual run's directions each
on their own, with their off-target rate, and their mean (`validate_directions`); the search
shared among torchrun ranks (`shared_search`). `validate.Validator` runs it during training.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from functools import partial

import torch

from attn_mt import distributed
from attn_mt.config.schema import TrainConfig
from attn_mt.data.batching import collate, length_batches
from attn_mt.data.corpus import Corpus
from attn_mt.decode.translator import Translator
from attn_mt.langid import off_target_rate
from attn_mt.model.loss import SmoothedObjective, perplexity
from attn_mt.precision import autocast_context
from attn_mt.scores import STRING_METRICS, score
from attn_mt.train.clock import Allowance
from attn_mt.train.runlog import Validation
from attn_mt.world import World

# The figures a multilingual run averages over its directions (`sentences` is summed).
MEAN_KEYS = ("loss", "ppl", *STRING_METRICS, "off_target")
# Under a time allowance, the sentences validated first, which give the pace (`chunks`).
FIRST_CHUNK = 8


class Interrupted(Exception):
    """A signal came during validation."""


@torch.no_grad()
def validate(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None],
    world: World,
    allowance: Allowance | None = None,
) -> Validation | None:
    """Validate `translator.model` on the corpus's validation split (in the translator's device
    and dtype); `on_progress(phase, done, total)` follows the sentences scored ("loss") and
    translated ("search"). Leaves the model in eval mode. The result on rank 0; under torchrun
    the other ranks search their share of the sentences (`search_share`) and return None.

    Under a time `allowance` the sentences go in chunks, in file order, as many as it holds
    (`chunks`): the figures are those of the sentences validated (`sentences` counts them).
    """
    total, hyps = len(corpus.valid_src), []
    sums, seconds = LossSums(), {"loss": 0.0, "search": 0.0}
    for rows in chunks(total, allowance, world):
        part = valid_rows(corpus, rows)
        start = time.perf_counter()
        if world.is_main:
            sums.add(translator, part, t, on_progress, rows.start, total)
        seconds["loss"] += time.perf_counter() - start
        start = time.perf_counter()
        hyps += search_share(translator, part, t, searched(on_progress, rows, total, world), world)
        seconds["search"] += time.perf_counter() - start
    if not world.is_main:
        return None
    validated = len(hyps)
    if validated < total:  # the time ran out: the bar ends with the sentences validated
        on_progress("search", validated, validated)
    refs = corpus.valid_ref[:validated]
    start = time.perf_counter()
    scores = score(hyps, refs, t.scored_metrics())
    seconds["score"] = time.perf_counter() - start
    metrics = sums.figures() | scores.values | {"sentences": validated}
    samples = list(zip(corpus.valid_src, hyps, refs, strict=False))[: t.samples]
    return Validation(metrics, samples, seconds, hypotheses=hyps)


def chunks(total: int, allowance: Allowance | None, world: World) -> Iterator[range]:
    """The rows of a validation set to validate, in order, as consecutive ranges: all at once
    without a time allowance; under one, FIRST_CHUNK rows, then up to twice as many as the
    chunk before, as many as the pace so far fits in the time left, until it is spent (the
    first chunk always runs, so a validation has its figures). Rank 0's clock decides for
    every rank."""
    done, size = 0, total if allowance is None else min(FIRST_CHUNK, total)
    while size > 0:
        yield range(done, done + size)
        done += size
        if allowance is None:
            return
        wanted = min(2 * size, total - done)
        size = distributed.from_main(partial(allowance.fits, done, wanted), world)


def valid_rows(corpus: Corpus, rows: range) -> Corpus:
    """`corpus` with the validation pairs `rows` only (the corpus itself for all of them)."""
    if len(rows) == len(corpus.valid_src):
        return corpus
    part = slice(rows.start, rows.stop)
    return dataclasses.replace(
        corpus,
        valid_src=corpus.valid_src[part],
        valid_ref=corpus.valid_ref[part],
        valid_src_ids=corpus.valid_src_ids[part],
        valid_tgt_ids=corpus.valid_tgt_ids[part],
    )


def searched(
    on_progress: Callable[[str, int, int], None], rows: range, total: int, world: World
) -> Callable[[int], None]:
    """The search's `on_batch(n)` for the chunk `rows` of a set of `total`: on_progress("search",
    sentences done in the set, total), at once from the chunk's start (so the search's bar
    replaces the finished loss bar before its first batch), the ranks taken to go at the same
    pace."""
    done = rows.start
    on_progress("search", done, total)

    def advance(count: int) -> None:
        nonlocal done
        done = min(done + count * world.size, rows.stop)
        on_progress("search", done, total)

    return advance


class LossSums:
    """The validation loss by teacher forcing, summed over the pairs scored (`add`): the
    label-smoothed loss and the NLL, summed on the device in float64 (as Python floats would
    be) and read once (`figures`), as a read per batch would make the CPU wait for a GPU."""

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None  # (2,): loss, nll
        self.tokens = 0

    @torch.no_grad()
    def add(
        self,
        translator: Translator,
        corpus: Corpus,
        t: TrainConfig,
        on_progress: Callable[[str, int, int], None],
        first: int = 0,
        total: int | None = None,
    ) -> None:
        """Score the corpus's validation pairs; on_progress("loss", first + n, total) after each
        batch, n the pairs scored so far (of a chunk: `first` pairs of a set of `total` before
        it; `total` defaults to the corpus's)."""
        objective = SmoothedObjective(translator.model, t.label_smoothing)
        if self.sums is None:
            self.sums = torch.zeros(2, dtype=torch.float64, device=translator.device)
        lengths = [
            (len(s) + 1, len(r) + 1)
            for s, r in zip(corpus.valid_src_ids, corpus.valid_tgt_ids, strict=True)
        ]
        scored = 0
        with autocast_context(translator.device, translator.dtype):
            for rows in length_batches(lengths, t.batch_tokens):
                batch = collate(corpus.valid_src_ids, corpus.valid_tgt_ids, rows)
                batch = batch.to(translator.device)
                objective.tokens = batch.num_tgt_tokens
                batch_loss, batch_nll = objective(batch.src, batch.tgt_in, batch.tgt_out)
                self.sums += torch.stack([batch_loss, batch_nll]).double()
                self.tokens += batch.num_tgt_tokens
                scored += len(rows)
                on_progress("loss", first + scored, total or len(lengths))

    def figures(self) -> dict[str, float]:
        """The loss per target token and the perplexity of the pairs scored."""
        loss, nll = self.sums.tolist() if self.sums is not None else (0.0, 0.0)
        return {"loss": loss / max(self.tokens, 1), "ppl": perplexity(nll, self.tokens)}


def search_share(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_batch: Callable[[int], None],
    world: World,
) -> list[str]:
    """The validation sentences translated, this rank searching its share (`shared_search`)."""

    def search(sentences: list[str]) -> list[str]:
        return translator.translate(
            sentences, beam=t.eval_beam, on_batch=on_batch, tgt_lang=corpus.valid_tgt_lang
        )

    return shared_search(search, corpus.valid_src, world)


def validate_directions(
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None],
    world: World,
    allowance: Allowance | None = None,
) -> Validation | None:
    """`validate` each direction of a multilingual `corpus.pairs` (each in an equal part of
    what is left of the `allowance`; the progress phases name the direction: "search de-en");
    the result's metrics are their mean (which picks best.pt and stops early as a bilingual
    run's one figure does) and its `pairs` each direction's own figures, with the off-target
    rate: the share of outputs not in the language asked for. None on ranks but rank 0."""
    languages = translator.config.data.target_languages()
    languages += [src for src, _ in translator.config.data.directions()]
    per_pair: dict[str, dict[str, float]] = {}
    samples: list[tuple[str, str, str]] = []
    seconds: dict[str, float] = {}
    for i, (pair, direction) in enumerate(corpus.pairs.items()):

        def follow(phase: str, done: int, total: int, pair: str = pair) -> None:
            on_progress(f"{phase} {pair}", done, total)

        part = allowance.part(len(corpus.pairs) - i) if allowance else None
        result = validate(translator, direction, t, follow, world, part)
        if result is None:
            continue
        tgt_lang = str(direction.valid_tgt_lang)
        rate = off_target_rate(result.hypotheses, tgt_lang, languages)
        per_pair[pair] = result.metrics | ({"off_target": rate} if rate is not None else {})
        samples += result.samples[:1]
        for phase, took in result.seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + took
    if not per_pair:
        return None
    metrics = {
        name: sum(m[name] for m in per_pair.values()) / len(per_pair)
        for name in MEAN_KEYS
        if all(name in m for m in per_pair.values())
    }
    metrics["sentences"] = sum(m["sentences"] for m in per_pair.values())
    return Validation(metrics, samples[: max(t.samples, 0)], seconds, pairs=per_pair)


def shared_search(
    search: Callable[[list[str]], list[str]], sentences: list[str], world: World
) -> list[str]:
    """`search(sentences)`, each rank searching its slice; the whole output on every rank, in
    order, for rank 0 to score. Rank r takes sentences r, r + size, r + 2 size, ...: sentences
    of every length on every rank, so the ranks finish at about the same time. Greedy and beam
    search translate a sentence the same way whatever else is in its batch (tests/unit/decode
    hold batched == one at a time), so the output is the one a single process would give.

    A search `Interrupted` on one rank is `Interrupted` on every rank, raised after the gather,
    so that the ranks' collectives stay paired (the checkpoint written next gathers too).
    """
    if not world.distributed:
        return search(sentences)
    mine: list[str] | None
    try:
        mine = search(sentences[world.rank :: world.size])
    except Interrupted:
        mine = None
    shares = distributed.gather(mine, world)
    hyps = [""] * len(sentences)
    for rank, share in enumerate(shares):
        if share is None:
            raise Interrupted
        hyps[rank :: world.size] = share
    return hyps
