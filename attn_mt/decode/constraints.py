"""Steered beam search: terms that must appear in the output (lexical constraints), a forced
output prefix, and words that must not appear.

Terms are kept by dynamic beam allocation (Post & Vilar, 2018), as fairseq's
`LexicallyConstrainedBeamSearch` does: each step's candidates are the 2K best continuations,
each beam's best token and the next token of every term each beam could advance; a candidate's
bank is the number of term tokens its hypothesis has met, and the K beams are dealt from the
banks in turn, fullest bank first (its best, then the next bank's best, ...). The fullest bank's
best always survives and any beam can add the next term token, so the best hypothesis meets one
more term token every step: once the output limit leaves room for the prefix, every term token
and <eos>, every term appears. <eos> is closed to a hypothesis until it has met every term.

The model runs batched over every beam of every sentence with the key/value cache; the banks
are dealt per sentence in Python (a hypothesis's progress is a small object), as in fairseq.

Shape legend: B sentences still searching, K beam size, N = B * K rows, V vocabulary, t step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from attn_mt.decode.search import (
    Hypothesis,
    Models,
    _sentence_done,
    _StepDecoder,
    length_penalty,
)
from attn_mt.errors import UserError
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID

NO_TERM = -1


@dataclass
class Controls:
    """What one line's output must hold: every term (piece ids each), the prefix it starts
    with, and none of the `avoid` piece sequences."""

    terms: list[list[int]] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)
    avoid: list[list[int]] = field(default_factory=list)

    def needed_length(self) -> int:
        """Output tokens the search may need: the prefix, every term token, and <eos>."""
        return len(self.prefix) + sum(len(term) for term in self.terms) + 1


def line_controls(
    tokenizer,
    lines: int,
    constraints: Sequence[Sequence[str]] | None,
    prefixes: Sequence[str | None] | None,
    avoid: Sequence[str],
    limit: int | None,
    first_line: int = 1,
) -> list[Controls | None]:
    """The Controls of each of `lines` lines (None: plain search), terms and prefixes segmented
    by the target SentencePiece; a UserError names the first bad line."""
    for name, given in (("constraints", constraints), ("prefixes", prefixes)):
        if given is not None and (isinstance(given, str) or len(given) != lines):
            raise UserError(f"{name}: give one entry per line ({lines}), [] or None for none")
    avoid_ids = [ids for ids in tokenizer.encode([_checked(a, "avoided word") for a in avoid])]
    if any(not ids for ids in avoid_ids):
        raise UserError("avoid: an avoided word is empty")
    result: list[Controls | None] = []
    for i in range(lines):
        number = first_line + i
        terms = [_checked(t, f"line {number}: a term") for t in (constraints or [()] * lines)[i]]
        prefix = (prefixes or [None] * lines)[i]
        prefix = _checked(prefix, f"line {number}: the prefix") if prefix else ""
        if not (terms or prefix or avoid_ids):
            result.append(None)
            continue
        term_ids = tokenizer.encode(terms)
        controls = Controls(term_ids, tokenizer.encode([prefix])[0] if prefix else [], avoid_ids)
        for what, ids in [*zip(terms, term_ids, strict=True), (prefix, controls.prefix)]:
            if any(_contains(ids, bad) for bad in avoid_ids):
                raise UserError(f"line {number}: {what!r} holds an avoided word")
        if limit is not None and controls.needed_length() > limit:
            raise UserError(
                f"line {number}: the prefix and terms take {controls.needed_length() - 1} "
                f"tokens, more than the model's output limit ({limit - 1})"
            )
        result.append(controls)
    return result


def _checked(text: object, what: str) -> str:
    """`text` stripped, or a UserError if it is not a non-empty one-line str."""
    if not isinstance(text, str):
        raise UserError(f"{what}: {text!r} is not a str")
    if "\t" in text or "\n" in text or "\r" in text:
        raise UserError(f"{what} {text!r} holds a TAB or line break")
    if not text.strip():
        raise UserError(f"{what} is empty")
    return text.strip()


def _contains(seq: Sequence[int], part: Sequence[int]) -> bool:
    """True if `part` occurs in `seq` as a contiguous run."""
    return any(list(seq[i : i + len(part)]) == list(part) for i in range(len(seq) - len(part) + 1))


@dataclass(frozen=True)
class Progress:
    """How far one hypothesis is through its sentence's terms: those met, and the one under way
    with how many of its tokens are in place (a term broken off starts over)."""

    met: frozenset[int] = frozenset()
    term: int = NO_TERM
    matched: int = 0

    def bank(self, terms: list[list[int]]) -> int:
        """Term tokens in place: every token of the met terms, and those of the one under way."""
        return sum(len(terms[i]) for i in self.met) + self.matched

    def complete(self, terms: list[list[int]]) -> bool:
        """True once every term is met."""
        return len(self.met) == len(terms)

    def next_tokens(self, terms: list[list[int]]) -> list[int]:
        """The tokens that advance a term: the next of the one under way, or any term's first."""
        if self.term != NO_TERM:
            return [terms[self.term][self.matched]]
        return [terms[i][0] for i in range(len(terms)) if i not in self.met]

    def advance(self, terms: list[list[int]], token: int) -> Progress:
        """The progress after `token`."""
        if self.term != NO_TERM and terms[self.term][self.matched] == token:
            return self._moved(terms, self.met, self.term, self.matched + 1)
        for i, term in enumerate(terms):  # none under way (or broken off): start one?
            if i not in self.met and term[0] == token:
                return self._moved(terms, self.met, i, 1)
        return Progress(self.met) if self.term != NO_TERM else self

    @staticmethod
    def _moved(terms: list[list[int]], met: frozenset[int], term: int, matched: int) -> Progress:
        if matched == len(terms[term]):
            return Progress(met | {term})
        return Progress(met, term, matched)


@torch.no_grad()
def steered_beam_search(
    model: Models,
    src: torch.Tensor,
    max_lengths: torch.Tensor,
    controls: Sequence[Controls],
    beam_size: int,
    alpha: float = 1.0,
    nbest: int = 1,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Beam search whose every output starts with its prefix, holds every term and none of
    the avoided sequences; the `nbest` best of every source row, best first.

    Args:
        src: (B, S) source ids, right-padded.  max_lengths: (B,) output limits in tokens, at
            least each row's `needed_length()`.  controls: (B,) what each row must hold.
    """
    batch, k, device = src.size(0), beam_size, src.device
    decoder = _StepDecoder(model, src, use_cache, repeat=k)
    alive = torch.arange(batch, device=device)  # original sentence of each live sentence
    prefix = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
    beam_scores = torch.full((batch, k), float("-inf"), device=device)  # (B, K)
    beam_scores[:, 0] = 0.0  # one beam starts; the others join as the first step branches
    progress = [Progress() for _ in range(batch * k)]  # per row
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(int(max_lengths.max())):
        n = alive.numel()
        log_probs = decoder.log_probs(prefix).view(n, k, -1)  # (B, K, V)
        at_limit = step + 1 >= max_lengths[alive]  # (B,) these may only end now
        log_probs[at_limit, :, :EOS_ID] = float("-inf")
        log_probs[at_limit, :, EOS_ID + 1 :] = float("-inf")
        rows = [controls[s] for s in alive.tolist()]
        _mask(log_probs, rows, progress, prefix, step)
        candidates = beam_scores[:, :, None] + log_probs  # (B, K, V)
        top_index = candidates.view(n, -1).topk(2 * k, dim=1).indices  # (B, 2K)
        vocab = log_probs.size(-1)
        best_token = log_probs.argmax(dim=-1).tolist()  # (B, K)
        choices, scores_at = [], []  # per sentence: its candidates (beam, token)
        for i, c in enumerate(rows):
            pairs = {(j // vocab, j % vocab) for j in top_index[i].tolist()}
            for beam in range(k):
                pairs.add((beam, best_token[i][beam]))
                pairs.update((beam, t) for t in progress[i * k + beam].next_tokens(c.terms))
            choices.append(sorted(pairs))
            scores_at.extend((i, beam, token) for beam, token in choices[-1])
        index = torch.tensor(scores_at, device=device).T  # (3, candidates)
        scores = candidates[index[0], index[1], index[2]].tolist()
        # An <eos> ends a hypothesis when it ranks among the K best continuations.
        ends = [
            {j // vocab for j in row if j % vocab == EOS_ID} for row in top_index[:, :k].tolist()
        ]
        next_rows, next_tokens, next_scores, next_progress = [], [], [], []
        offset = 0
        for i, (c, pairs) in enumerate(zip(rows, choices, strict=True)):
            kept = []
            for (beam, token), score in zip(
                pairs, scores[offset : offset + len(pairs)], strict=True
            ):
                if score == float("-inf"):
                    continue
                row = i * k + beam
                if token == EOS_ID:
                    if beam in ends[i]:
                        tokens = prefix[row, 1:].tolist()
                        lp = length_penalty(len(tokens) + 1, alpha)
                        finished[int(alive[i])].append(Hypothesis(tokens, score, score / lp))
                    continue
                state = progress[row].advance(c.terms, token)
                kept.append((state.bank(c.terms), score, row, token, state))
            offset += len(pairs)
            chosen = _deal(kept, k)
            chosen += [(0, float("-inf"), i * k, PAD_ID, Progress())] * (k - len(chosen))
            for _, score, row, token, state in chosen:
                next_rows.append(row)
                next_tokens.append(token)
                next_scores.append(score)
                next_progress.append(state)
        source_row = torch.tensor(next_rows, device=device)  # (N,)
        next_token = torch.tensor(next_tokens, device=device)[:, None]  # (N, 1)
        prefix = torch.cat([prefix.index_select(0, source_row), next_token], dim=1)
        decoder.reorder_beams(source_row)
        beam_scores = torch.tensor(next_scores, device=device).view(n, k)  # (B, K)
        progress = next_progress
        open_lp = length_penalty(step + 1, alpha)  # the open beams hold step + 1 tokens
        best_open = [score / open_lp for score in beam_scores.max(dim=1).values.tolist()]
        done = [_sentence_done(finished[s], k, best_open[i]) for i, s in enumerate(alive.tolist())]
        if all(done):
            break
        if any(done):
            keep = torch.tensor([i for i, d in enumerate(done) if not d], device=device)
            rows_kept = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B' * K,)
            alive, beam_scores = alive[keep], beam_scores[keep]
            prefix = prefix.index_select(0, rows_kept)
            progress = [progress[r] for r in rows_kept.tolist()]
            decoder.select(rows_kept)
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished]


def _mask(
    log_probs: torch.Tensor,
    rows: list[Controls],
    progress: list[Progress],
    prefix: torch.Tensor,
    step: int,
) -> None:
    """Close, in log_probs (B, K, V), every token a row's controls forbid now: all but the
    prefix's next token while the prefix lasts, the last token of an avoided sequence the
    output would complete, and <eos> before every term is met."""
    k = log_probs.size(1)
    for i, c in enumerate(rows):
        if step < len(c.prefix):
            forced = log_probs[i, :, c.prefix[step]].clone()
            log_probs[i] = float("-inf")
            log_probs[i, :, c.prefix[step]] = forced
        for beam in range(k):
            if c.avoid:
                output = prefix[i * k + beam, 1:].tolist()
                for bad in c.avoid:
                    if len(bad) == 1 or output[max(len(output) - len(bad) + 1, 0) :] == bad[:-1]:
                        log_probs[i, beam, bad[-1]] = float("-inf")
            if not progress[i * k + beam].complete(c.terms):
                log_probs[i, beam, EOS_ID] = float("-inf")


def _deal(kept: list[tuple], k: int) -> list[tuple]:
    """Dynamic beam allocation: the K candidates (bank, score, ...) taken from the banks in
    turn, fullest bank first, each bank's best first."""
    kept.sort(key=lambda cand: (-cand[0], -cand[1]))
    rank_in_bank, previous, rank = [], None, 0
    for cand in kept:
        rank = rank + 1 if cand[0] == previous else 0
        previous = cand[0]
        rank_in_bank.append(rank)
    order = sorted(range(len(kept)), key=lambda j: (rank_in_bank[j], -kept[j][0], -kept[j][1]))
    return [kept[j] for j in order[:k]]
