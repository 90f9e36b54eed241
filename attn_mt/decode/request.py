"""What one call of `Translator.translate_nbest` asks for, as one typed, frozen value (as
transformers' `GenerationConfig`): the search (beam, n-best, length penalty, or sampling), what
the outputs must hold (terms, prefixes, avoided words), alignment, and the batching. Checked
once, by `resolved`, whose messages name the command-line options that set each field; it names
its search strategy (`strategy`) and how many source tokens a batch of it holds (`line_budget`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from attn_mt.config.schema import DecodeConfig
from attn_mt.decode.controls import Controls
from attn_mt.decode.generate import Strategy
from attn_mt.decode.glossary import Glossary
from attn_mt.decode.search import Beam, Draw, Greedy, Sampling
from attn_mt.decode.steered import SteeredBeam
from attn_mt.errors import UserError


@dataclass(frozen=True)
class Request:
    """The options of one translation call; None takes the checkpoint's decode.* setting.

    beam: the beam size (1 = greedy); None means decode.beam, widened to `nbest` if that is
    larger.  nbest: outputs per line (with `sampling`, samples per line, in the order drawn).
    constraints[i]: terms (plain text) line i's output must hold; prefixes[i]: the text it must
    start with (None or "" for none); glossary: source terms whose target term becomes a
    constraint of each line that holds one; avoid: words no output may hold; alignment: fill each
    Translation's `alignment` (see docs/decoding.md).  tgt_lang: the language to translate
    into (a multilingual model needs it; a bilingual one takes only its own).  first_line: the
    number of the first line in the user's input, for warnings and the samples' random streams
    (a line samples the same in any chunk of the input).  on_batch(n): called after each batch
    with the lines it finished.  on_line(i, entries): called with each line's entries as soon
    as it is done (in batch order, not input order), so a caller interrupted mid-call keeps
    what was finished.
    """

    beam: int | None = None
    nbest: int = 1
    length_penalty: float | None = None
    use_cache: bool = True
    batch_tokens: int | None = None
    sampling: Sampling | None = None
    constraints: Sequence[Sequence[str]] | None = None
    prefixes: Sequence[str | None] | None = None
    glossary: Glossary | None = None
    avoid: Sequence[str] = ()
    alignment: bool = False
    tgt_lang: str | None = None
    first_line: int = 1
    on_batch: Callable[[int], None] | None = field(default=None, compare=False)
    on_line: Callable[[int, list], None] | None = field(default=None, compare=False)

    def resolved(self, decode: DecodeConfig, vocab: int) -> Request:
        """This request checked (its options together, and against a target vocabulary of
        `vocab` pieces), with the beam, length penalty and batch budget that `decode` gives
        where they are None. Each line's terms and prefix are checked as it is segmented
        (`controls.line_controls`)."""
        beam, nbest = self.beam, self.nbest
        terms = any(self.constraints or ()) or self.glossary is not None  # terms to keep
        if self.sampling is not None:
            if beam is not None:
                raise UserError(f"--beam {beam}: sampling searches no beam; leave --beam out")
            if not 1 <= nbest <= vocab:  # rows of the batch, as a beam's are
                raise UserError(f"--nbest {nbest}: need 1 to {vocab} samples per line")
            if terms or self.avoid or any(self.prefixes or ()):
                raise UserError("--sample draws freely: it takes no constraints, prefix or avoid")
        else:
            beam = max(decode.beam, nbest) if beam is None else beam
            if beam < 1 or not 1 <= nbest <= beam or beam > vocab:
                raise UserError(
                    f"--beam {beam} --nbest {nbest}: need beam >= 1 and 1 <= nbest <= beam, "
                    f"and a beam no wider than the target vocabulary ({vocab} pieces)"
                )
            if beam == 1 and terms:
                raise UserError(
                    "--beam 1: constraints need a beam to share among the terms; use --beam 2+"
                )
        alpha = decode.length_penalty if self.length_penalty is None else self.length_penalty
        budget = self.batch_tokens or decode.batch_tokens
        return replace(self, beam=beam, length_penalty=alpha, batch_tokens=budget)

    def line_budget(self) -> int:
        """Source tokens a batch may hold (of a resolved request): samples are rows of their
        own; a sentence's K beams share one row of its source side (encoder output,
        cross-attention keys), and a wider batch spreads each step's ranking and bookkeeping
        over more sentences, so a beam counts (K + 1) / 2 rows a line (docs/performance.md,
        "Decoding"; the sweep behind it: docs/history.md)."""
        budget = self.batch_tokens or 0
        if self.sampling is not None:
            return max(budget // self.nbest, 1)
        return max(2 * budget // ((self.beam or 1) + 1), 1)

    def strategy(self, lines: Sequence[int], controls: Sequence[Controls] = ()) -> Strategy:
        """The search this (resolved) request names for one batch of source lines: steered beam
        search where they carry `controls` (every line of the batch, or none), sampling, greedy
        search (beam 1) or beam search. `lines`: their numbers in the user's input, which seed
        the samples."""
        beam = self.beam or 1
        if controls:
            return SteeredBeam(controls, beam, self.nbest)
        if self.sampling is not None:
            return Draw(self.sampling, lines, self.nbest)
        if beam == 1:
            return Greedy()
        return Beam(beam, self.nbest)
