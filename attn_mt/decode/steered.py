"""Steered beam search: every output starts with its line's prefix, holds each of its terms
(lexical constraints) and none of the avoided words (`Controls`, checked in `controls.py`).

Terms are kept by dynamic beam allocation (Post & Vilar, 2018), as fairseq's
`LexicallyConstrainedBeamSearch` does: each step's candidates are the 2K best continuations,
each beam's best token and the next token of every term each beam could advance; a candidate's
bank is the number of term tokens its hypothesis has met, and the K beams are dealt from the
banks in turn, fullest bank first (its best, then the next bank's best, ...); when the banks
outnumber the beams, neighbouring banks share a turn. The fullest bank's best always survives
and any beam can add the next term token, so the best hypothesis meets one more term token
every step: once the output limit leaves room for the prefix, every term token
and <eos>, every term appears. <eos> is closed to a hypothesis until it has met every term.

The model runs batched over every beam of every sentence with the key/value cache; the banks
are dealt per sentence in Python (a hypothesis's progress is a small object), as in fairseq.

Shape legend: B sentences still searching, K beam size, N = B * K rows, V vocabulary, t step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_mt.decode.controls import Controls
from attn_mt.decode.generate import Step, Strategy
from attn_mt.model.vocab import EOS_ID, PAD_ID


@dataclass(frozen=True)
class TermProgress:
    """How far one hypothesis is through its sentence's terms: those met, and the partial
    matches the output ends with, (term, tokens matched), so terms sharing a start (e.g. the
    word-start piece) are all followed."""

    met: frozenset[int] = frozenset()
    partial: tuple[tuple[int, int], ...] = ()

    def bank(self, terms: list[list[int]]) -> int:
        """Term tokens in place: every token of the met terms, and the longest partial match."""
        return sum(len(terms[i]) for i in self.met) + max((m for _, m in self.partial), default=0)

    def complete(self, terms: list[list[int]]) -> bool:
        """True once every term is met."""
        return len(self.met) == len(terms)

    def next_tokens(self, terms: list[list[int]]) -> list[int]:
        """The tokens that advance a term: a partial match's next, or an unmet term's first."""
        going = {terms[term][matched] for term, matched in self.partial}
        return sorted(going | {terms[i][0] for i in range(len(terms)) if i not in self.met})

    def advance(self, terms: list[list[int]], token: int) -> TermProgress:
        """The progress after `token` (it meets at most one term)."""
        grown = [(term, m + 1) for term, m in self.partial if terms[term][m] == token]
        grown += [(i, 1) for i, term in enumerate(terms) if i not in self.met and term[0] == token]
        met = self.met
        if (done := next((t for t, m in grown if m == len(terms[t])), None)) is not None:
            met = met | {done}
        partial = sorted({(t, m) for t, m in grown if t not in met and m < len(terms[t])})
        return TermProgress(met, tuple(partial))


class SteeredBeam(Strategy):
    """K beams per sentence dealt from the banks of term tokens met (`_deal`), after the
    prefix, avoided words and unmet terms closed their tokens (`mask`); the `nbest` best
    hypotheses returned, each starting with its sentence's prefix, holding every term and none
    of the avoided sequences (`controls` (B,), what each source row must hold; its output
    limit must be at least the row's `needed_length()`). All K rows run from the first step:
    one starts, the others join as it branches."""

    def __init__(self, controls: Sequence[Controls], beam_size: int, nbest: int = 1):
        self.controls, self.beam_size, self.nbest = list(controls), beam_size, nbest
        self.progress: list[TermProgress] = []  # per row

    def start(self, limits: list[int], device: torch.device) -> torch.Tensor:
        """(B, K) scores: beam 0 at 0, the others -inf until the first step branches."""
        groups = len(limits)
        self.progress = [TermProgress() for _ in range(groups * self.beam_size)]
        scores = torch.full((groups, self.beam_size), float("-inf"), device=device)
        scores[:, 0] = 0.0
        return scores

    def mask(self, log_probs, prefix, alive, step) -> None:
        """The logits processors, in order: the prefix, the avoided words, <eos> held back
        until every term is met."""
        rows = [self.controls[s] for s in alive]
        force_prefix(log_probs, rows, step)
        close_avoided(log_probs, rows, prefix)
        hold_eos(log_probs, rows, self.progress)

    def step(self, step, log_probs, scores, alive, alive_index) -> Step:
        """Candidates (the 2K best, each beam's best, each beam's term tokens) dealt per
        sentence into K beams; as in beam search, an <eos> among the first K dealt ends a
        hypothesis, and the first K others go on (in the banks' order, not the scores')."""
        n, k, vocab = log_probs.shape
        device = log_probs.device
        rows = [self.controls[s] for s in alive]
        candidates = scores[:, :, None] + log_probs  # (G, K, V)
        top_index = candidates.view(n, -1).topk(2 * k, dim=1).indices.tolist()  # (G, 2K)
        best_token = log_probs.argmax(dim=-1).tolist()  # (G, K)
        choices: list[list[tuple[int, int]]] = []  # per sentence: its candidates (beam, token)
        scores_at: list[tuple[int, int, int]] = []
        for i, c in enumerate(rows):
            pairs = {(j // vocab, j % vocab) for j in top_index[i]}
            for beam in range(k):
                pairs.add((beam, best_token[i][beam]))
                pairs.update((beam, t) for t in self.progress[i * k + beam].next_tokens(c.terms))
            choices.append(sorted(pairs))
            scores_at.extend((i, beam, token) for beam, token in choices[-1])
        at = torch.tensor(scores_at, device=device).T  # (3, candidates)
        found = candidates[at[0], at[1], at[2]].tolist()
        ended, totals, beams = [], [], []  # beams: (score, row, token, progress) per row
        offset = 0
        for i, (c, chosen) in enumerate(zip(rows, choices, strict=True)):
            kept = []  # (bank, score, row, token, progress after it)
            scored = found[offset : offset + len(chosen)]
            offset += len(chosen)
            for (beam, token), score in zip(chosen, scored, strict=True):
                if score > float("-inf"):
                    state = self.progress[i * k + beam].advance(c.terms, token)
                    kept.append((state.bank(c.terms), score, i * k + beam, token, state))
            mine: list[tuple] = []
            for rank, (_, score, row, token, state) in enumerate(_deal(kept, k, c.banks())):
                if token == EOS_ID and rank < k:
                    ended.append((i, row))
                    totals.append(score)
                elif token != EOS_ID and len(mine) < k:
                    mine.append((score, row, token, state))
            beams += mine + [(float("-inf"), i * k, PAD_ID, TermProgress())] * (k - len(mine))
        next_scores, next_rows, next_tokens, self.progress = map(list, zip(*beams, strict=True))
        return Step(
            token=torch.tensor(next_tokens, device=device).view(n, k),
            scores=torch.tensor(next_scores, device=device).view(n, k),
            source_row=torch.tensor(next_rows, device=device).view(n, k),
            ended=ended,
            ended_scores=torch.tensor(totals, device=device) if ended else None,
            best_open=[max(next_scores[i * k : (i + 1) * k]) for i in range(n)],
        )

    def select(self, keep: list[int]) -> None:
        """Keep the term progress of the rows of the sentences `keep`."""
        k = self.beam_size
        self.progress = [self.progress[i * k + beam] for i in keep for beam in range(k)]


def force_prefix(log_probs: torch.Tensor, rows: list[Controls], step: int) -> None:
    """Close, in log_probs (G, K, V), all but the prefix's next token while the prefix lasts."""
    for i, c in enumerate(rows):
        if step < len(c.prefix):
            forced = log_probs[i, :, c.prefix[step]].clone()
            log_probs[i] = float("-inf")
            log_probs[i, :, c.prefix[step]] = forced


def close_avoided(log_probs: torch.Tensor, rows: list[Controls], prefix: torch.Tensor) -> None:
    """Close, in log_probs (G, K, V), the last token of an avoided sequence that each row's
    output (prefix (N, t)) would complete."""
    k = log_probs.size(1)
    for i, c in enumerate(rows):
        for beam in range(k) if c.avoid else ():
            output = prefix[i * k + beam, 1:].tolist()
            for bad in c.avoid:
                if len(bad) == 1 or output[max(len(output) - len(bad) + 1, 0) :] == bad[:-1]:
                    log_probs[i, beam, bad[-1]] = float("-inf")


def hold_eos(log_probs: torch.Tensor, rows: list[Controls], progress: list[TermProgress]) -> None:
    """Close, in log_probs (G, K, V), <eos> to every row that has not met all its terms."""
    k = log_probs.size(1)
    for i, c in enumerate(rows):
        for beam in range(k):
            if not progress[i * k + beam].complete(c.terms):
                log_probs[i, beam, EOS_ID] = float("-inf")


def _deal(kept: list[tuple], k: int, banks: int) -> list[tuple]:
    """Dynamic beam allocation: the candidates (bank, score, ...) in the order they get beams:
    the best of the fullest bank, then the banks in turn, fullest first, each bank's best
    first. When the `banks` outnumber the other K - 1 beams, neighbouring banks share a turn
    (so hypotheses with few term tokens keep a beam: Post & Vilar's low banks starve)."""
    if not kept:
        return []
    top = max(kept, key=lambda cand: (cand[0], cand[1]))
    groups = max(min(banks, k - 1), 1)
    rest = sorted(
        ((cand[0] * groups // banks, cand) for cand in kept if cand is not top),
        key=lambda pair: (-pair[0], -pair[1][1]),
    )
    turn, previous, count = [], None, 0
    for group, _ in rest:
        count = count + 1 if group == previous else 0
        previous = group
        turn.append(count)
    order = sorted(range(len(rest)), key=lambda j: (turn[j], -rest[j][0], -rest[j][1][1]))
    return [top] + [rest[j][1] for j in order]
