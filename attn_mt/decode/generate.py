"""The one search loop, `generate`, over `Transformer.encode` / `decode`, batched over
sentences, for one model or an ensemble; a strategy (greedy, sampling, beam in `search.py`,
steered beam in `steered.py`), which the `Request` names, only chooses each step's tokens, as
fairseq's `SequenceGenerator._generate` and its `search.py` do.

The loop owns what every search shares: the encoder output and KV cache (`StepDecoder`), the
output limit (the last allowed token must be <eos>), finishing a hypothesis (tokens and score
read in one transfer), dropping the groups that are done (`_sentence_done`), and the n-best
order. The encoder runs once; the decoder runs one step at a time, with the key/value cache
(or, for checking, recomputing the whole prefix). An ensemble's next-token log-probabilities
are the mean of its models' log-probabilities (not renormalised, so a hypothesis scores the
mean of the models' log P(y | x)); each model keeps its own encoder output and KV cache.

The bookkeeping lives on the host: a step reads what the strategy decided, and where
hypotheses ended, their prefixes and scores, in one more read. On a GPU every read waits until
the device has caught up, so none is per row.

Shape legend: G groups still searching (a sentence's beams, or one greedy row or sample each),
W rows per group (1, or the beam size K), N = G * W rows, V vocabulary, t step, E hypotheses
ending at a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_mt.decode.packed import rows_of
from attn_mt.model.attention import padding_mask
from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID

# One model, or an ensemble of models of one vocabulary whose log-probabilities are averaged.
Models = Transformer | Sequence[Transformer]


@dataclass
class Hypothesis:
    """One output: token ids (no <bos>/<eos>), summed log-probability, and its search score."""

    tokens: list[int]
    logprob: float  # log P(tokens, <eos> | source)
    score: float  # logprob / lp(len(tokens) + 1) (`Scoring`)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def plain_length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = |Y| ** alpha: the penalty of transformers, fairseq, Marian and CTranslate2."""
    return float(length) ** alpha


# decode.length_penalty_kind -> lp(|Y|, alpha); a score is logprob / lp(|Y|), |Y| with <eos>
LENGTH_PENALTIES = {"gnmt": length_penalty, "plain": plain_length_penalty}


@dataclass(frozen=True)
class Scoring:
    """How the search scores a hypothesis: logprob / lp(length) with the length penalty `kind`
    (`LENGTH_PENALTIES`) and exponent `alpha`; with `free_end`, the <eos> forced at the output
    limit costs nothing (transformers' `forced_eos_token_id`), else its own log-probability."""

    alpha: float = 0.0
    kind: str = "gnmt"
    free_end: bool = False

    def penalty(self, length: int) -> float:
        """lp(length), `length` counting the <eos>."""
        return LENGTH_PENALTIES[self.kind](length, self.alpha)


def max_output_lengths(src: torch.Tensor, a: float, b: int, cap: int | None = None) -> torch.Tensor:
    """Per-sentence output limit a * source_length + b (source without padding), capped."""
    src_len = (src != PAD_ID).sum(dim=1).float()
    limit = (a * src_len.double() + b).clamp(min=1, max=2**31 - 1).long()  # no overflow
    return limit.clamp(max=cap) if cap is not None else limit


def indices(values: list[int], device: torch.device) -> torch.Tensor:
    """Host integers as an index tensor on `device`. To a GPU from pinned memory, without
    waiting: a plain copy from the host would wait for the queue to empty, as a read does."""
    index = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)


class StepDecoder:
    """Next-token log-probabilities for a batch of prefixes, with or without a KV cache: of one
    model, or the mean over an ensemble's models, each with its own memory and cache.

    A beam search keeps one row per sentence of what its K beams share (the encoder output,
    the source mask, cross-attention's keys and values) and K rows of what differs (prefixes,
    self-attention caches): cross-attention then scores a sentence's K queries against one
    copy of its keys (`MultiHeadAttention`'s row groups), reading them once, not K times.
    `repeat` instead copies the shared rows for searches whose rows leave one at a time.
    With a cache the encoder output is read once, at the first step, into cross-attention's
    keys and values: from then on it is not kept in step with the rows.
    """

    def __init__(
        self,
        models: Models,
        src: torch.Tensor,
        use_cache: bool,
        repeat: int = 1,
        rows: torch.Tensor | None = None,
    ):
        self.models = [models] if isinstance(models, Transformer) else list(models)
        self.use_cache = use_cache
        src_mask = padding_mask(src, PAD_ID)  # (B, 1, 1, S)
        self.src_mask = src_mask.repeat_interleave(repeat, dim=0)  # (N, 1, 1, S)
        self.memories = [  # per model (N, S, D)
            model.encode(src, src_mask).repeat_interleave(repeat, dim=0) for model in self.models
        ]
        self.caches = [model.new_cache() if use_cache else None for model in self.models]
        # A shortlist's rows (U,): each model's output layer cut to them (`rows_of`).
        self.rows, self.vocab = rows, self.models[0].output.out_features
        self.outputs = [
            None if rows is None else rows_of(model.output, rows) for model in self.models
        ]

    def log_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """prefix (N, t) -> log P(next token | prefix, source) (N, V), in float32; with a
        shortlist, the softmax over its rows, every other token -inf."""
        step_input = prefix[:, -1:] if self.use_cache else prefix
        per_model = []  # each (N, V), or (N, U) with a shortlist
        for model, output, memory, cache in zip(
            self.models, self.outputs, self.memories, self.caches, strict=True
        ):
            if output is None:
                logits = model.decode(step_input, memory, self.src_mask, cache)[:, -1]
            else:
                states = model.decoder_states(step_input, memory, self.src_mask, cache)
                logits = output(states[:, -1])
            per_model.append(_log_softmax(logits))
        log_probs = torch.stack(per_model).mean(dim=0) if len(per_model) > 1 else per_model[0]
        if self.rows is not None:  # the rows back among all V ids
            full = log_probs.new_full((log_probs.size(0), self.vocab), float("-inf"))
            log_probs = full.index_copy_(1, self.rows, log_probs)
        log_probs[:, PAD_ID] = float("-inf")  # never generated (two column fills: a list
        log_probs[:, BOS_ID] = float("-inf")  # index would take an index_put over the rows)
        return log_probs

    def reorder_beams(self, rows: torch.Tensor) -> None:
        """Reorder rows within their sentences (beam search's survivors, `rows` (N,) from the
        same sentence's rows; also one row per sentence becoming K): only the self-attention
        caches differ between a sentence's beams; what they share stays as it is."""
        for cache in self.caches:
            for self_cache, _ in cache or ():
                self_cache.select(rows)

    def select(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        """Keep rows `rows` (the sentences still searching, or any reordering); with
        `sentences`, the shared rows kept are those sentences (one row each), else `rows`."""
        shared = rows if sentences is None else sentences
        if not self.use_cache:  # with a cache, `decode` read the memory at the first step only
            self.memories = [memory.index_select(0, shared) for memory in self.memories]
        self.src_mask = self.src_mask.index_select(0, shared)
        for cache in self.caches:
            for self_cache, cross_cache in cache or ():
                self_cache.select(rows)
                cross_cache.select(shared)


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax of logits (N, V) in float32, written over them where they are float32: a
    second tensor of the output layer's size would be fresh memory at every step. Masks come
    after it, so that scores are the models' own log-probabilities."""
    logits = logits.float().contiguous()  # a view of the last position, without a cache
    return torch.log_softmax(logits, -1, out=logits)


@dataclass
class Step:
    """What a strategy chose at one step, for `generate` to carry out.

    token: (G, W') the next token of each next row.  scores: (G, W') their log-probabilities
    so far.  source_row: (G, W') the row of the N each next row continues, or None where every
    row goes on in place.  ended: (group, row) of each hypothesis ending here with <eos>, its
    row of the N; ended_scores: (E,) their log-probabilities, on the device.  best_open: per
    group, the best open row's log-probability (-inf: none open; inf: not read, still open).
    """

    token: torch.Tensor
    scores: torch.Tensor
    source_row: torch.Tensor | None
    ended: list[tuple[int, int]]
    ended_scores: torch.Tensor | None
    best_open: list[float]


class Strategy:
    """How a search chooses the next tokens (greedy, sampling, beam, steered beam); the rest of
    the search is `generate`'s. `beam_size` finished hypotheses end a group, of which the
    `nbest` best are returned; `repeat` groups start per source row (samples of one line)."""

    beam_size = 1
    nbest = 1
    repeat = 1

    def start(self, limits: list[int], device: torch.device) -> torch.Tensor:
        """The first rows' log-probabilities (G, W) of groups with these output `limits`: one
        row per group, at 0."""
        return torch.zeros(len(limits), 1, device=device)

    def mask(
        self, log_probs: torch.Tensor, prefix: torch.Tensor, alive: list[int], step: int
    ) -> None:
        """Close, in log_probs (G, W, V), the tokens this search forbids now (none here)."""

    def step(
        self,
        step: int,
        log_probs: torch.Tensor,
        scores: torch.Tensor,
        alive: list[int],
        alive_index: torch.Tensor,
    ) -> Step:
        """Choose the next tokens from log_probs (G, W, V) and the rows' scores (G, W);
        `alive` (host) and `alive_index` (device) are the groups' original numbers."""
        raise NotImplementedError

    def select(self, keep: list[int]) -> None:
        """Keep the state of the groups `keep` only (they are still searching)."""


@torch.no_grad()
def generate(
    models: Models,
    src: torch.Tensor,
    max_lengths: torch.Tensor,
    strategy: Strategy,
    alpha: float | Scoring = 0.0,
    use_cache: bool = True,
    rows: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Search with `strategy`: the hypotheses of every source row, the `strategy.nbest` best of
    each of its groups, best first (its `strategy.repeat` samples: one each, in the order drawn).

    Args:
        src: (B, S) source ids, right-padded.  max_lengths: (B,) output limits in tokens.
        alpha: how hypotheses are scored (`Scoring`), or the exponent of the GNMT penalty.
        rows: the target ids the output layer scores (a shortlist's rows for this batch, on
            src's device); None: every id.
    """
    scoring = alpha if isinstance(alpha, Scoring) else Scoring(alpha)
    if not 1 <= strategy.nbest <= strategy.beam_size:
        raise ValueError(
            f"nbest ({strategy.nbest}) must be between 1 and the beam size ({strategy.beam_size})"
        )
    decoder = StepDecoder(models, src, use_cache, strategy.repeat, rows)
    device = src.device
    limits = max_lengths.repeat_interleave(strategy.repeat).long().tolist()  # per group
    alive = list(range(len(limits)))  # the original group of each live group
    alive_index = torch.arange(len(limits), device=device)  # the same on the device
    scores = strategy.start(limits, device)  # (G, W)
    prefix = torch.full((scores.numel(), 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
    finished: list[list[Hypothesis]] = [[] for _ in limits]
    for step in range(max(limits, default=0)):
        n, width = scores.shape
        log_probs = decoder.log_probs(prefix).view(n, width, -1)  # (G, W, V)
        at_limit = [i for i, group in enumerate(alive) if step + 1 >= limits[group]]
        if at_limit:  # the last allowed token must be <eos>
            last = indices(at_limit, device)
            log_probs[last, :, :EOS_ID] = float("-inf")
            log_probs[last, :, EOS_ID + 1 :] = float("-inf")
            if scoring.free_end:
                log_probs[last, :, EOS_ID] = 0.0
        strategy.mask(log_probs, prefix, alive, step)
        chosen = strategy.step(step, log_probs, scores, alive, alive_index)
        if chosen.ended:
            _finish(chosen, prefix, [finished[alive[i]] for i, _ in chosen.ended], scoring)
        if chosen.source_row is not None:
            source_row = chosen.source_row.view(-1)  # (N',)
            prefix = prefix.index_select(0, source_row)
            decoder.reorder_beams(source_row)  # at a beam's first step, 1 row becomes K
        prefix = torch.cat([prefix, chosen.token.view(-1, 1)], dim=1)  # (N', t + 1)
        scores = chosen.scores
        open_lp = scoring.penalty(step + 1)  # the open rows hold step + 1 tokens
        keep = [
            i
            for i, group in enumerate(alive)
            if not _sentence_done(
                finished[group], strategy.beam_size, chosen.best_open[i] / open_lp
            )
        ]
        if not keep:
            break
        if len(keep) < n:
            index = indices(keep, device)
            width = scores.size(1)
            rows = (index[:, None] * width + torch.arange(width, device=device)).view(-1)
            alive, alive_index = [alive[i] for i in keep], alive_index[index]
            scores, prefix = scores[index], prefix.index_select(0, rows)
            decoder.select(rows, sentences=index)
            strategy.select(keep)
    ranked = [sorted(hyps, key=lambda h: h.score, reverse=True) for hyps in finished]
    per_row = strategy.repeat  # groups per source row
    return [
        [h for hyps in ranked[first : first + per_row] for h in hyps[: strategy.nbest]]
        for first in range(0, len(ranked), per_row)
    ]


def _finish(
    chosen: Step, prefix: torch.Tensor, into: list[list[Hypothesis]], scoring: Scoring
) -> None:
    """Append each ended hypothesis to its group's list `into` (one per ended): its score and
    its tokens (no <bos>, no <eos>) read in one transfer, exact in float64."""
    assert chosen.ended_scores is not None, "called only when hypotheses ended"
    rows = indices([row for _, row in chosen.ended], prefix.device)
    scores = chosen.ended_scores.double()[:, None]  # (E, 1)
    read = torch.cat([scores, prefix.index_select(0, rows)[:, 1:].double()], dim=1).tolist()
    for hyps, (total, *path) in zip(into, read, strict=True):
        tokens = [int(t) for t in path]
        hyps.append(Hypothesis(tokens, total, total / scoring.penalty(len(tokens) + 1)))


def _sentence_done(finished: list[Hypothesis], beam_size: int, best_open_score: float) -> bool:
    """True once the K-th best finished score reaches the best open beam's score so far.

    Log-probabilities only fall as a beam grows, so with alpha = 0 no open beam can still
    overtake; with alpha > 0 the bound is a heuristic (as in Hugging Face's beam search). With
    K = 1 the one finished hypothesis outranked every open beam, so this is exactly greedy.
    A sentence without open beams (score -inf) is done.
    """
    if len(finished) < beam_size:
        return best_open_score == float("-inf")
    kth_best = sorted((h.score for h in finished), reverse=True)[beam_size - 1]
    return kth_best >= best_open_score
