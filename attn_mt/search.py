"""Greedy and beam search over `Transformer.encode` / `decode`, batched over sentences.

The encoder runs once; the decoder runs one step at a time, with the key/value cache (or, for
checking, recomputing the whole prefix). Sentences that finish leave the batch, and the search
ends as soon as every sentence is done.

Shape legend: B sentences still searching, K beam size, N = B * K rows, V vocabulary, t step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_mt.attention import padding_mask
from attn_mt.model import Transformer
from attn_mt.tokenizer import BOS_ID, EOS_ID, PAD_ID


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
    limit = (a * src_len + b).long().clamp(min=1)
    return limit.clamp(max=cap) if cap is not None else limit


class _StepDecoder:
    """Next-token log-probabilities for a batch of prefixes, with or without a KV cache."""

    def __init__(self, model: Transformer, src: torch.Tensor, use_cache: bool, repeat: int = 1):
        self.model, self.use_cache = model, use_cache
        self.src_mask = padding_mask(src, PAD_ID).repeat_interleave(repeat, dim=0)  # (N,1,1,S)
        memory = model.encode(src, padding_mask(src, PAD_ID))  # (B, S, D)
        self.memory = memory.repeat_interleave(repeat, dim=0)  # (N, S, D)
        self.cache = model.new_cache() if use_cache else None

    def log_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """prefix (N, t) -> log P(next token | prefix, source) (N, V), in float32."""
        step_input = prefix[:, -1:] if self.use_cache else prefix
        logits = self.model.decode(step_input, self.memory, self.src_mask, self.cache)[:, -1]
        # Mask after the softmax, so that scores are the model's own log-probabilities.
        log_probs = logits.float().log_softmax(dim=-1)  # (N, V)
        log_probs[:, [PAD_ID, BOS_ID]] = float("-inf")  # never generated
        return log_probs

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` (reordered beams, or the sentences still searching)."""
        self.memory = self.memory.index_select(0, rows)
        self.src_mask = self.src_mask.index_select(0, rows)
        for self_cache, cross_cache in self.cache or ():
            self_cache.select(rows)
            cross_cache.select(rows)


@torch.no_grad()
def greedy_search(
    model: Transformer,
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
    decoder = _StepDecoder(model, src, use_cache)
    batch = src.size(0)
    alive = torch.arange(batch, device=src.device)  # original row of each live row
    prefix = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B, 1)
    logprob = torch.zeros(batch, device=src.device)
    results: list[Hypothesis | None] = [None] * batch
    for step in range(int(max_lengths.max())):
        log_probs = decoder.log_probs(prefix)  # (B, V)
        at_limit = step + 1 >= max_lengths[alive]  # the last allowed token must be <eos>
        log_probs[at_limit, :EOS_ID] = float("-inf")
        log_probs[at_limit, EOS_ID + 1 :] = float("-inf")
        best_logprob, token = log_probs.max(dim=-1)  # (B,), (B,)
        logprob += best_logprob
        prefix = torch.cat([prefix, token[:, None]], dim=1)  # (B, t + 1)
        done = token == EOS_ID
        for row in done.nonzero().flatten().tolist():
            tokens = prefix[row, 1:-1].tolist()
            total = float(logprob[row])
            results[int(alive[row])] = Hypothesis(
                tokens, total, total / length_penalty(len(tokens) + 1, alpha)
            )
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().flatten()
            alive, prefix, logprob = alive[keep], prefix[keep], logprob[keep]
            decoder.select(keep)
    return results  # type: ignore[return-value]


@torch.no_grad()
def beam_search(
    model: Transformer,
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
    decoder = _StepDecoder(model, src, use_cache, repeat=k)
    alive = torch.arange(batch, device=device)  # original sentence of each live sentence
    prefix = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
    beam_scores = torch.full((batch, k), float("-inf"), device=device)
    beam_scores[:, 0] = 0.0  # all beams start identical: let only the first one expand
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(int(max_lengths.max())):
        n = alive.numel()
        log_probs = decoder.log_probs(prefix).view(n, k, -1)  # (B, K, V)
        vocab = log_probs.size(-1)
        at_limit = step + 1 >= max_lengths[alive]  # (B,) these may only end now
        log_probs[at_limit, :, :EOS_ID] = float("-inf")
        log_probs[at_limit, :, EOS_ID + 1 :] = float("-inf")
        candidates = (beam_scores[:, :, None] + log_probs).view(n, k * vocab)  # (B, K*V)
        top_scores, top_index = candidates.topk(2 * k, dim=1)  # (B, 2K)
        top_beam, top_token = top_index // vocab, top_index % vocab  # (B, 2K)
        is_eos = top_token == EOS_ID
        # Finish the <eos> candidates ranked among the first K.
        ended = (is_eos[:, :k] & top_scores[:, :k].isfinite()).nonzero().tolist()
        for i, j in ended:
            row = i * k + int(top_beam[i, j])
            tokens = prefix[row, 1:].tolist()
            total = float(top_scores[i, j])
            hyp = Hypothesis(tokens, total, total / length_penalty(len(tokens) + 1, alpha))
            finished[int(alive[i])].append(hyp)
        # The best K non-<eos> candidates become the next beams.
        open_scores = top_scores.masked_fill(is_eos, float("-inf"))
        beam_scores, pick = open_scores.topk(k, dim=1)  # (B, K)
        source_row = torch.arange(n, device=device)[:, None] * k + top_beam.gather(1, pick)
        next_token = top_token.gather(1, pick).view(-1, 1)  # (N, 1)
        prefix = torch.cat([prefix.index_select(0, source_row.view(-1)), next_token], dim=1)
        decoder.select(source_row.view(-1))
        open_lp = length_penalty(step + 1, alpha)  # the open beams hold step + 1 tokens
        best_open = [score / open_lp for score in beam_scores.max(dim=1).values.tolist()]
        done = torch.tensor(
            [_sentence_done(finished[s], k, best_open[i]) for i, s in enumerate(alive.tolist())],
            device=device,
        )
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().flatten()
            rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B' * K,)
            alive, beam_scores = alive[keep], beam_scores[keep]
            prefix = prefix.index_select(0, rows)
            decoder.select(rows)
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished]


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
