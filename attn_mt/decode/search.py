"""Greedy search, beam search and sampling over `Transformer.encode` / `decode`, batched over
sentences, for one model or an ensemble.

The encoder runs once; the decoder runs one step at a time, with the key/value cache (or, for
checking, recomputing the whole prefix). Sentences that finish leave the batch, and the search
ends as soon as every sentence is done. An ensemble's next-token log-probabilities are the mean
of its models' log-probabilities (not renormalised, so a hypothesis scores the mean of the
models' log P(y | x)); each model keeps its own encoder output and KV cache.

Shape legend: B sentences still searching, K beam size (or samples per sentence), N = B * K
rows, V vocabulary, t step.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attn_mt.errors import UserError
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
    score: float  # logprob / length_penalty(len(tokens) + 1)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src: torch.Tensor, a: float, b: int, cap: int | None = None) -> torch.Tensor:
    """Per-sentence output limit a * source_length + b (source without padding), capped."""
    src_len = (src != PAD_ID).sum(dim=1).float()
    limit = (a * src_len.double() + b).clamp(min=1, max=2**31 - 1).long()  # no overflow
    return limit.clamp(max=cap) if cap is not None else limit


def _indices(values: list[int], device: torch.device) -> torch.Tensor:
    """Host integers as an index tensor on `device`. To a GPU from pinned memory, without
    waiting: a plain copy from the host would wait for the queue to empty, as a read does."""
    index = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)


class _StepDecoder:
    """Next-token log-probabilities for a batch of prefixes, with or without a KV cache: of one
    model, or the mean over an ensemble's models, each with its own memory and cache.

    A beam search keeps one row per sentence of what its K beams share (the encoder output,
    the source mask, cross-attention's keys and values) and K rows of what differs (prefixes,
    self-attention caches): cross-attention then scores a sentence's K queries against one
    copy of its keys (`MultiHeadAttention`'s row groups), reading them once, not K times.
    `repeat` instead copies the shared rows for searches whose rows leave one at a time.
    """

    def __init__(self, models: Models, src: torch.Tensor, use_cache: bool, repeat: int = 1):
        self.models = [models] if isinstance(models, Transformer) else list(models)
        self.use_cache = use_cache
        src_mask = padding_mask(src, PAD_ID)  # (B, 1, 1, S)
        self.src_mask = src_mask.repeat_interleave(repeat, dim=0)  # (N, 1, 1, S)
        self.memories = [  # per model (N, S, D)
            model.encode(src, src_mask).repeat_interleave(repeat, dim=0) for model in self.models
        ]
        self.caches = [model.new_cache() if use_cache else None for model in self.models]

    def log_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """prefix (N, t) -> log P(next token | prefix, source) (N, V), in float32."""
        step_input = prefix[:, -1:] if self.use_cache else prefix
        per_model = [
            # Mask after the softmax, so that scores are the models' own log-probabilities.
            model.decode(step_input, memory, self.src_mask, cache)[:, -1].float().log_softmax(-1)
            for model, memory, cache in zip(self.models, self.memories, self.caches, strict=True)
        ]  # each (N, V)
        log_probs = torch.stack(per_model).mean(dim=0) if len(per_model) > 1 else per_model[0]
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
        self.memories = [memory.index_select(0, shared) for memory in self.memories]
        self.src_mask = self.src_mask.index_select(0, shared)
        for cache in self.caches:
            for self_cache, cross_cache in cache or ():
                self_cache.select(rows)
                cross_cache.select(shared)


@torch.no_grad()
def greedy_search(
    model: Models,
    src: torch.Tensor,
    max_lengths: torch.Tensor,
    alpha: float = 0.0,
    use_cache: bool = True,
) -> list[Hypothesis]:
    """Pick the most probable token at every step; one Hypothesis per source row.

    Args:
        src: (B, S) source ids, right-padded.  max_lengths: (B,) output limits in tokens.
        alpha: length-penalty exponent, used only for the reported score.
    """
    return _one_path_search(
        model,
        src,
        max_lengths,
        alpha,
        use_cache,
        lambda log_probs, rows, step: log_probs.argmax(-1),
    )


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


@torch.no_grad()
def sample(
    model: Models,
    src: torch.Tensor,
    max_lengths: torch.Tensor,
    sampling: Sampling,
    lines: Sequence[int],
    samples: int = 1,
    alpha: float = 0.0,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """`samples` random outputs of every source row, in the order drawn.

    Args:
        src: (B, S) source ids, right-padded.  max_lengths: (B,) output limits in tokens.
        lines: (B,) the number of each row in the user's input; it seeds the row's draws.
        alpha: length-penalty exponent, used only for the reported score.
    """
    limits = max_lengths.repeat_interleave(samples)  # (N,)
    steps = limits.long().tolist()  # one copy to the host, not one per row
    uniforms = torch.zeros(len(steps), max(steps, default=0))  # (N, longest)
    for row, (line, j) in enumerate((line, j) for line in lines for j in range(samples)):
        uniforms[row, : steps[row]] = sampling.uniforms(line, j, steps[row])
    uniforms = uniforms.to(src.device)
    hyps = _one_path_search(
        model,
        src,
        limits,
        alpha,
        use_cache,
        lambda log_probs, rows, step: sampling.pick(log_probs, uniforms[rows, step]),
        repeat=samples,
    )
    return [hyps[i : i + samples] for i in range(0, len(hyps), samples)]


# (log_probs (N, V), the original rows of those N, step) -> the next token of each row (N,)
TokenChoice = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def _one_path_search(
    model: Models,
    src: torch.Tensor,
    max_lengths: torch.Tensor,
    alpha: float,
    use_cache: bool,
    choose: TokenChoice,
    repeat: int = 1,
) -> list[Hypothesis]:
    """Extend one prefix per row by the token `choose` picks until it picks <eos>; `repeat`
    rows per source row, with max_lengths (B * repeat,).

    The bookkeeping (which rows are at their limit, which ended) lives on the host: a step
    reads the chosen tokens, and where rows ended, their prefixes and scores, in one more
    read. On a GPU every read waits until the device has caught up, so none is per row.
    """
    decoder = _StepDecoder(model, src, use_cache, repeat)
    device = src.device
    rows = src.size(0) * repeat
    limits = max_lengths.long().tolist()  # per live row
    alive = list(range(rows))  # the original row of each live row
    alive_rows = torch.arange(rows, device=device)  # the same on the device, for `choose`
    prefix = torch.full((rows, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
    logprob = torch.zeros(rows, device=device)
    results: list[Hypothesis | None] = [None] * rows
    for step in range(max(limits, default=0)):
        log_probs = decoder.log_probs(prefix)  # (N, V)
        if step + 1 >= min(limits):  # the last allowed token must be <eos>
            last = _indices([i for i, limit in enumerate(limits) if step + 1 >= limit], device)
            log_probs[last, :EOS_ID] = float("-inf")
            log_probs[last, EOS_ID + 1 :] = float("-inf")
        token = choose(log_probs, alive_rows, step)  # (N,)
        logprob += log_probs.gather(1, token[:, None]).squeeze(1)
        prefix = torch.cat([prefix, token[:, None]], dim=1)  # (N, t + 1)
        ended = [i for i, next_token in enumerate(token.tolist()) if next_token == EOS_ID]
        if not ended:
            continue
        index = _indices(ended, device)
        # Each ended row's score, then its tokens (no <bos>, no <eos>): exact in float64.
        finished = torch.cat([logprob[index, None].double(), prefix[index, 1:-1].double()], 1)
        for i, (total, *path) in zip(ended, finished.tolist(), strict=True):
            tokens = [int(t) for t in path]
            results[alive[i]] = Hypothesis(
                tokens, total, total / length_penalty(len(tokens) + 1, alpha)
            )
        if len(ended) == len(alive):
            break
        gone = set(ended)
        keep = [i for i in range(len(alive)) if i not in gone]
        index = _indices(keep, device)
        alive, limits = [alive[i] for i in keep], [limits[i] for i in keep]
        alive_rows, prefix, logprob = alive_rows[index], prefix[index], logprob[index]
        decoder.select(index)
    return results  # type: ignore[return-value]


@torch.no_grad()
def beam_search(
    model: Models,
    src: torch.Tensor,
    max_lengths: torch.Tensor,
    beam_size: int,
    alpha: float = 1.0,
    nbest: int = 1,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Beam search; returns the `nbest` best hypotheses of every source row, best first.

    At each step the 2K best continuations of each sentence's K beams are ranked; an <eos>
    among the first K ends a hypothesis, scored logprob / lp(length), and the best K others
    go on. A sentence is done once it holds K finished hypotheses and the best open beam,
    scored logprob / lp(its length so far), does not beat the K-th of them (`_sentence_done`).
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam size ({beam_size})")
    batch, k = src.size(0), beam_size
    device = src.device
    # All K beams of a sentence would start as the same <s>: the first step runs one row per
    # sentence, then its K best become K (what they share stays one row: `_StepDecoder`).
    width = 1  # beams per sentence: 1 for the first step, K after it
    decoder = _StepDecoder(model, src, use_cache)
    # The bookkeeping lives on the host, as in `_one_path_search`: per step, one transfer of
    # what the ranking decided and, when some hypotheses ended, one of their prefixes.
    limits = max_lengths.long().tolist()  # per sentence
    alive = list(range(batch))  # the original sentence of each live sentence
    prefix = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
    beam_scores = torch.zeros(batch, width, device=device)  # (B, width)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(max(limits, default=0)):
        n = len(alive)
        log_probs = decoder.log_probs(prefix).view(n, width, -1)  # (B, width, V)
        vocab = log_probs.size(-1)
        at_limit = [i for i, s in enumerate(alive) if step + 1 >= limits[s]]  # may only end now
        if at_limit:
            last = _indices(at_limit, device)
            log_probs[last, :, :EOS_ID] = float("-inf")
            log_probs[last, :, EOS_ID + 1 :] = float("-inf")
        top_scores, top_index = top_candidates(log_probs, beam_scores, 2 * k)  # (B, 2K)
        top_beam, top_token = top_index // vocab, top_index % vocab  # (B, 2K)
        is_eos = top_token == EOS_ID
        # The best K non-<eos> candidates become the next beams.
        open_scores = top_scores.masked_fill(is_eos, float("-inf"))
        beam_scores, pick = open_scores.topk(k, dim=1)  # (B, K), best first
        # To the host, per sentence: which of the first K candidates end (an <eos> with a
        # finite score), their beams and scores, and the best open beam's score, in float32
        # (the scores' own type; beam numbers are small integers, exact in it).
        ended = is_eos[:, :k] & top_scores[:, :k].isfinite()
        decided = torch.cat([ended, top_beam[:, :k], top_scores[:, :k], beam_scores[:, :1]], 1)
        ends = []  # (sentence, row of the ended beam, score)
        best_open = []
        for i, values in enumerate(decided.tolist()):
            best_open.append(values[3 * k])
            if any(values[:k]):
                ends += [
                    (alive[i], i * width + int(values[k + j]), values[2 * k + j])
                    for j in range(k)
                    if values[j]
                ]
        if ends:  # finish them: the prefixes of their beams, in one transfer
            rows = _indices([row for _, row, _ in ends], device)
            paths = prefix.index_select(0, rows)[:, 1:].tolist()
            for (sentence, _, total), path in zip(ends, paths, strict=True):
                score = total / length_penalty(len(path) + 1, alpha)
                finished[sentence].append(Hypothesis(path, total, score))
        source_row = torch.arange(n, device=device)[:, None] * width + top_beam.gather(1, pick)
        next_token = top_token.gather(1, pick).view(-1, 1)  # (N, 1)
        prefix = torch.cat([prefix.index_select(0, source_row.view(-1)), next_token], dim=1)
        decoder.reorder_beams(source_row.view(-1))  # at the first step, 1 row becomes K
        width = k
        open_lp = length_penalty(step + 1, alpha)  # the open beams hold step + 1 tokens
        keep = [
            i
            for i, s in enumerate(alive)
            if not _sentence_done(finished[s], k, best_open[i] / open_lp)
        ]
        if not keep:
            break
        if len(keep) < n:
            index = _indices(keep, device)
            rows = (index[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B' * K,)
            alive = [alive[i] for i in keep]
            beam_scores = beam_scores[index]
            prefix = prefix.index_select(0, rows)
            decoder.select(rows, sentences=index)
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished]


# `top_candidates`' chunk sizes, best first: whole vector registers (a chunk size that is not
# ran far slower; docs/performance.md), and short enough that the second ranking is small; any
# divisor of the vocabulary up to MAX_CHUNK where none of them divides it.
CHUNK_SIZES = (64, 128, 32, 256, 16)
MAX_CHUNK = 256


def top_candidates(
    log_probs: torch.Tensor, beam_scores: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `count` best continuations of each sentence, best first: their scores
    beam_scores[b, w] + log_probs[b, w, v] and indices w * V + v, both (B, count). The same
    values as `(log_probs + beam_scores[..., None]).view(B, -1).topk(count)`; among equal
    scores the index may differ.

    torch's topk copies all W * V (value, index) pairs of a row before it selects; this reads
    log_probs once. Each beam's V tokens are cut into chunks of C; the `count` chunks whose
    maxima (plus their beam's score) rank highest hold the `count` best candidates: a chunk
    holding one of them has a maximum at least as high, and the chosen chunks' maxima are
    `count` candidates that high or higher. Only those count * C candidates are then ranked.

    Args:
        log_probs: (B, W, V), contiguous.  beam_scores: (B, W).
    """
    batch, width, vocab = log_probs.shape
    size = _chunk_size(vocab, width, count)
    if size is None:  # no useful chunking of this vocabulary: rank every candidate
        candidates = (log_probs + beam_scores[:, :, None]).view(batch, width * vocab)
        return candidates.topk(count, dim=1)
    chunks = log_probs.view(batch, width * (vocab // size), size)  # (B, W * V / C, C)
    shift = beam_scores.repeat_interleave(vocab // size, dim=1)  # (B, W * V / C) each chunk's
    best = (chunks.amax(dim=2) + shift).topk(count, dim=1).indices  # (B, count) chunks
    picked = chunks.gather(1, best[:, :, None].expand(-1, -1, size))  # (B, count, C)
    picked = picked + shift.gather(1, best)[:, :, None]  # the same sums as above, bit for bit
    scores, position = picked.view(batch, count * size).topk(count, dim=1)  # (B, count)
    return scores, best.gather(1, position // size) * size + position % size


@functools.cache
def _chunk_size(vocab: int, width: int, count: int) -> int | None:
    """A divisor C of `vocab` leaving at least `count` chunks over `width` beams: the first of
    CHUNK_SIZES that does, else the largest up to MAX_CHUNK; None where only C = 1 does
    (nothing to gain over a plain topk)."""
    divisors = [
        size
        for size in range(2, MAX_CHUNK + 1)
        if vocab % size == 0 and width * vocab // size >= count
    ]
    preferred = [size for size in CHUNK_SIZES if size in divisors]
    return preferred[0] if preferred else max(divisors, default=None)


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
