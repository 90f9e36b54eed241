"""Greedy search, beam search and sampling: strategies of the one search loop
(`attn_mt.decode.generate.generate`), which only choose each step's tokens; a `Request` names
the one it asks for.

Shape legend: G groups still searching (a sentence's beams, or one greedy row or sample each),
W rows per group (1, or the beam size K), N = G * W rows, V vocabulary, t step.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_mt.decode.generate import Step, Strategy, indices
from attn_mt.errors import UserError
from attn_mt.model.vocab import EOS_ID


@dataclass(frozen=True)
class Sampling:
    """Draw each output token at random instead of searching (e.g. for back-translation): from
    the model's distribution at `temperature`, cut to the `top_k` most probable tokens (0 = no
    cut) and to the nucleus, the fewest most probable tokens whose probability reaches `top_p`
    (1 = no cut). The draws of a source line come from its own random stream, seeded from
    (`seed`, the line's number, the sample's number): the same line number gives the same
    samples whatever else is in its batch."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.temperature < math.inf:
            raise UserError(f"temperature {self.temperature}: must be a finite number > 0")
        if self.top_k < 0:
            raise UserError(f"top-k {self.top_k}: must be >= 0 (0 = no cut)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top-p {self.top_p}: must be in (0, 1] (1 = no cut)")

    def uniforms(self, line: int, sample: int, steps: int) -> torch.Tensor:
        """The uniform draws in [0, 1) of one output, one per step; (steps,), on the CPU."""
        key = hashlib.blake2b(f"{self.seed}/{line}/{sample}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(key, "little"))
        return torch.rand(steps, generator=generator)

    def pick(self, log_probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """One token per row of log_probs (N, V) by inverse transform sampling: in order of
        probability, the first token at which the kept tokens' cumulative probability reaches
        uniform (N,) times their total; (N,)."""
        # Shifted so the likeliest token is at 0 before dividing: a temperature near 0 then
        # gives 0 and -inf (greedy), never -inf alone (no probabilities at all).
        shifted = log_probs - log_probs.amax(dim=-1, keepdim=True)  # (N, V)
        scaled, order = (shifted / self.temperature).sort(dim=-1, descending=True, stable=True)
        probs = scaled.softmax(dim=-1)  # (N, V), most probable first; masked tokens get 0
        keep = torch.ones_like(probs, dtype=torch.bool)
        if self.top_k:
            keep[:, self.top_k :] = False
        if self.top_p < 1:
            keep &= probs.cumsum(dim=-1) - probs < self.top_p  # the mass before it < top_p
        cdf = (probs * keep).cumsum(dim=-1)  # (N, V)
        rank = (cdf < uniform[:, None] * cdf[:, -1:]).sum(dim=-1).clamp(max=cdf.size(1) - 1)
        return order.gather(1, rank[:, None]).squeeze(1)


class Greedy(Strategy):
    """One row per group, extended by its most probable token until that is <eos>."""

    def choose(self, log_probs: torch.Tensor, alive_index: torch.Tensor, step: int) -> torch.Tensor:
        """The next token of each row of log_probs (G, V); (G,)."""
        return first_argmax(log_probs)

    def step(self, step, log_probs, scores, alive, alive_index) -> Step:
        """Each row's chosen token; a row that chose <eos> ends (one read: the tokens)."""
        log_probs = log_probs[:, 0]  # (G, V): one row per group
        token = self.choose(log_probs, alive_index, step)  # (G,)
        scores = scores + log_probs.gather(1, token[:, None])  # (G, 1)
        ended = [i for i, next_token in enumerate(token.tolist()) if next_token == EOS_ID]
        best_open = [math.inf] * len(alive)  # not read: an open row may still score anything
        for i in ended:
            best_open[i] = float("-inf")  # nothing left open
        ended_scores = None
        if ended:
            ended_scores = scores.view(-1).index_select(0, indices(ended, scores.device))  # (E,)
        return Step(token[:, None], scores, None, [(i, i) for i in ended], ended_scores, best_open)


class Draw(Greedy):
    """`Sampling`'s draws instead of the most probable token: `samples` outputs of every source
    row (groups of their own, in the order drawn), whose draws come from the stream of the
    row's number in the user's input, `lines` (B,)."""

    def __init__(self, sampling: Sampling, lines: Sequence[int], samples: int = 1):
        self.sampling, self.lines, self.repeat = sampling, list(lines), samples
        self.uniforms = torch.zeros(0, 0)  # (G, longest), drawn at `start`

    def start(self, limits: list[int], device: torch.device) -> torch.Tensor:
        """Draw every group's uniforms for its whole output limit in advance, then start as
        greedy search does."""
        self.uniforms = torch.zeros(len(limits), max(limits, default=0))  # (G, longest)
        groups = ((line, j) for line in self.lines for j in range(self.repeat))
        for group, (line, j) in enumerate(groups):
            self.uniforms[group, : limits[group]] = self.sampling.uniforms(line, j, limits[group])
        self.uniforms = self.uniforms.to(device)
        return super().start(limits, device)

    def choose(self, log_probs: torch.Tensor, alive_index: torch.Tensor, step: int) -> torch.Tensor:
        """The draw of each row of log_probs (G, V) from its own stream; (G,)."""
        return self.sampling.pick(log_probs, self.uniforms[alive_index, step])


class Beam(Strategy):
    """K beams per sentence, the `nbest` best hypotheses returned.

    At each step the 2K best continuations (all, if fewer) of each sentence's K beams are
    ranked; an <eos> among the first K ends a hypothesis, scored logprob / lp(length), and the
    best K others go on. A sentence is done once it holds K finished hypotheses and the best
    open beam, scored logprob / lp(its length so far), does not beat the K-th of them. All K
    would start as the same <s>: the first step runs one row per sentence, then its K best
    become K (what they share stays one row: `StepDecoder`)."""

    def __init__(self, beam_size: int, nbest: int = 1):
        self.beam_size, self.nbest = beam_size, nbest

    def step(self, step, log_probs, scores, alive, alive_index) -> Step:
        """The 2K best continuations ranked; <eos> among the first K ends, the best K others go
        on. One read: which of the first K end, their beams, and the best open score."""
        n, width, vocab = log_probs.shape
        k, device = self.beam_size, log_probs.device
        # 2K candidates, or all W * V where there are fewer (a beam wider than half the
        # vocabulary, at its first step): at least K, as K <= V; any beams short of K open
        # candidates score -inf and never end a hypothesis.
        count = min(2 * k, width * vocab)
        top_scores, top_index = top_candidates(log_probs, scores, count)  # (G, count)
        top_beam, top_token = top_index // vocab, top_index % vocab  # (G, count)
        is_eos = top_token == EOS_ID
        # The best K non-<eos> candidates become the next beams.
        open_scores = top_scores.masked_fill(is_eos, float("-inf"))
        beam_scores, pick = open_scores.topk(k, dim=1)  # (G, K), best first
        # To the host, per sentence: which of the first K candidates end (an <eos> with a
        # finite score), their beams, and the best open beam's score, in float32 (the
        # scores' own type; beam numbers are small integers, exact in it).
        ended = is_eos[:, :k] & top_scores[:, :k].isfinite()
        decided = torch.cat([ended, top_beam[:, :k], beam_scores[:, :1]], 1).tolist()
        ends = [  # (sentence, row of the ended beam, candidate)
            (i, i * width + int(values[k + j]), i * k + j)
            for i, values in enumerate(decided)
            for j in range(k)
            if values[j]
        ]
        ended_scores = None
        if ends:
            candidate = indices([c for *_, c in ends], device)
            ended_scores = top_scores[:, :k].reshape(-1).index_select(0, candidate)  # (E,)
        source_row = torch.arange(n, device=device)[:, None] * width + top_beam.gather(1, pick)
        return Step(
            token=top_token.gather(1, pick),
            scores=beam_scores,
            source_row=source_row,
            ended=[(i, row) for i, row, _ in ends],
            ended_scores=ended_scores,
            best_open=[values[2 * k] for values in decided],
        )


# `top_candidates`' and `first_argmax`'s chunk sizes, best first: whole vector registers (a
# chunk size that is not ran far slower; docs/history.md, "CPU decoding speed"), and short enough
# that the second ranking is small. The last V mod C tokens of a row, no whole chunk, are ranked
# as they are.
CHUNK_SIZES = (64, 128, 32, 256, 16)


def top_candidates(
    log_probs: torch.Tensor, beam_scores: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `count` best continuations of each sentence, best first: their scores
    beam_scores[b, w] + log_probs[b, w, v] and indices w * V + v, both (B, count). The same
    values as `(log_probs + beam_scores[..., None]).view(B, -1).topk(count)`; among equal
    scores the index may differ.

    torch's topk copies all W * V (value, index) pairs of a row before it selects; this reads
    log_probs once. Each beam's first V - V mod C tokens are cut into chunks of C; the `count`
    chunks whose maxima (plus their beam's score) rank highest hold the best candidates of
    those tokens: a chunk holding one of them has a maximum at least as high, and the chosen
    chunks' maxima are `count` candidates that high or higher. Only those count * C candidates
    and each beam's last V mod C tokens (the tail, R of them) are then ranked.

    Args:
        log_probs: (B, W, V), contiguous.  beam_scores: (B, W).
    """
    batch, width, vocab = log_probs.shape
    size = _chunk_size(vocab, width, count)
    if size is None:  # no useful chunking of this vocabulary: rank every candidate
        candidates = (log_probs + beam_scores[:, :, None]).view(batch, width * vocab)
        return candidates.topk(count, dim=1)
    per_beam, tail = vocab // size, vocab % size
    chunks = log_probs[:, :, : vocab - tail].unflatten(2, (per_beam, size))  # (B, W, V/C, C)
    shift = beam_scores.repeat_interleave(per_beam, dim=1)  # (B, W * V/C) each chunk's
    maxima = chunks.amax(dim=3).view(batch, width * per_beam) + shift
    best = maxima.topk(min(count, width * per_beam), dim=1).indices  # (B, count) chunks
    # a chunk's first candidate: beam * V + chunk * C
    first = (best // per_beam) * vocab + (best % per_beam) * size  # (B, count)
    offsets = torch.arange(size, device=log_probs.device)
    index = (first[:, :, None] + offsets).view(batch, -1)  # (B, count * C)
    flat = log_probs.view(batch, width * vocab)
    picked = flat.gather(1, index) + shift.gather(1, best).repeat_interleave(size, dim=1)
    if tail:  # (B, W * R) the tail's candidates, the same sums
        tail_index = (
            torch.arange(width, device=log_probs.device)[:, None] * vocab
            + torch.arange(vocab - tail, vocab, device=log_probs.device)
        ).view(-1)
        tail_scores = (log_probs[:, :, vocab - tail :] + beam_scores[:, :, None]).view(batch, -1)
        picked = torch.cat([picked, tail_scores], dim=1)
        index = torch.cat([index, tail_index.expand(batch, -1)], dim=1)
    scores, position = picked.topk(count, dim=1)  # (B, count)
    return scores, index.gather(1, position)


def first_argmax(values: torch.Tensor) -> torch.Tensor:
    """values.argmax(-1) of values (R, V): the first position of each row's maximum; (R,).
    torch's argmax over a long row runs far below the speed of a reduction such as amax, so
    the maximum is found among chunk maxima (`CHUNK_SIZES`), then in its first chunk."""
    rows, vocab = values.shape
    size = CHUNK_SIZES[0]
    per_row, tail = vocab // size, vocab % size
    if per_row < 2:
        return values.argmax(-1)
    maxima = values[:, : vocab - tail].unflatten(1, (per_row, size)).amax(dim=2)  # (R, V/C)
    if tail:  # the tail as one more chunk
        maxima = torch.cat([maxima, values[:, vocab - tail :].amax(dim=1, keepdim=True)], 1)
    top = maxima.amax(dim=1, keepdim=True)  # (R, 1)
    chunk = (maxima == top).int().argmax(dim=1)  # (R,) the first chunk holding it
    # Positions past the row's end (the tail chunk) read its last value again: a repeat of a
    # value comes after it, so the first maximum is never one of them.
    index = (chunk[:, None] * size + torch.arange(size, device=values.device)).clamp(max=vocab - 1)
    return chunk * size + values.gather(1, index).argmax(dim=1)


@functools.cache
def _chunk_size(vocab: int, width: int, count: int) -> int | None:
    """The first of CHUNK_SIZES that cuts each of `width` beams of `vocab` tokens into chunks
    at least `count` in all; None where none does (nothing to gain over a plain topk)."""
    return next((size for size in CHUNK_SIZES if width * (vocab // size) >= count), None)
