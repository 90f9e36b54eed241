"""The translation API: the `Translator` that `attn_mt.load` (`decode/load.py`) returns; the
CLI's `translate` and `evaluate` are thin wrappers over it, so a notebook gets exactly what the
command line gets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from attn_mt.config.schema import Config
from attn_mt.data.batching import length_batches, source_batch
from attn_mt.data.ids import input_limit, language_prefix, source_ids
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decode.alignment import (
    Alignment,
    cross_attention,
    output_words,
    source_words,
    word_alignment,
)
from attn_mt.decode.controls import Controls, line_controls
from attn_mt.decode.generate import Models, Scoring, generate, max_output_lengths
from attn_mt.decode.packed import linear_layers
from attn_mt.decode.request import Request
from attn_mt.decode.written import given_back, lost_numbers, read_again
from attn_mt.errors import LINE_BREAKS, UserError
from attn_mt.model.transformer import Transformer, parameter_count
from attn_mt.precision import autocast_context
from attn_mt.text.form import LineForm, TextRules

# A run of line breaks in an output, written as one space: a caller that splits the output
# either way gets one line per input line.
_LINE_BREAKS = re.compile(f"[{re.escape(''.join(sorted(LINE_BREAKS)))}]+")


@dataclass
class Translation:
    """One n-best entry: the text, its search score (length-normalised log-probability), and
    on request its word alignment to the source (Pharaoh (source word, target word) pairs)."""

    text: str
    score: float
    tokens: list[int]
    alignment: Alignment | None = None


class Translator:
    """Translate lists of sentences with a trained model or an ensemble of models of one
    vocabulary (greedy search, beam search or sampling)."""

    def __init__(
        self,
        model: Models,
        config: Config,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        checkpoints: Sequence[Path] = (),
        parameters: int | None = None,
        text: TextRules | None = None,
    ):
        self.device = torch.device(device) if isinstance(device, str) else device
        models = [model] if isinstance(model, Transformer) else list(model)
        self.models = [m.to(self.device).eval() for m in models]
        self.model = self.models[0]  # the one model (an ensemble's first, for attention plots)
        # `parameter_count` of the model, given by `load` where it packed or quantized the layers
        self.parameters = parameter_count(self.model) if parameters is None else parameters
        self.config, self.src_tokenizer, self.tgt_tokenizer = config, src_tokenizer, tgt_tokenizer
        self.dtype = dtype  # autocast dtype, None = float32
        self.checkpoints = list(checkpoints)  # the .pt files loaded, if known (evaluate's output)
        bounded = [m.max_positions for m in self.models if m.max_positions]
        self.max_output_len = min(bounded) if bounded else None  # every model's table fits
        # decode.recase and decode.protect (`decode/written.py`); None: lines read as given
        self.text = text
        # decode.shortlist (`decode/shortlist.py`), read and checked against the vocabularies
        self.shortlist = None
        if config.decode.shortlist:
            from attn_mt.decode.shortlist import read_shortlist

            self.shortlist = read_shortlist(config.decode.shortlist, src_tokenizer, tgt_tokenizer)

    @property
    def max_input_len(self) -> int:
        """decode.max_input_len, within the positional table (the source gets one <eos>)."""
        return input_limit(self.config.decode.max_input_len, self.max_output_len)

    @property
    def target_languages(self) -> list[str]:
        """The languages this model translates into (several: a multilingual model)."""
        return self.config.data.target_languages()

    def language_prefix(self, tgt_lang: str | None) -> list[int]:
        """The ids put before each source to ask for `tgt_lang` (the `<2xx>` tag of a model of
        several target languages; none for one), checked against the model's languages."""
        return language_prefix(self.config.data, self.src_tokenizer, tgt_lang)

    def encode(
        self,
        lines: Sequence[str],
        tgt_lang: str | None = None,
        first_line: int = 1,
        warn: bool = True,
    ) -> list[list[int]]:
        """The source ids of each line as the model reads them (without the `<eos>` a batch
        adds), by the one rule of `attn_mt.data.ids.source_ids`: the line stripped and
        segmented, its pieces cut to decode.max_input_len less the tag, after the `<2xx>` tag
        of `tgt_lang` (`language_prefix`: a multilingual model's, checked); a blank line gives
        []. Translation, evaluation, scoring, attention, the server and the exports' checks
        all come here; validation builds its ids by the same rule.

        Each line cut is warned about, numbered from `first_line`; `warn=False` where the same
        lines are translated too (which warns), so that a line gets one warning.
        """
        prefix = self.language_prefix(tgt_lang)
        return source_ids(self.src_tokenizer, lines, prefix, self.max_input_len, first_line, warn)

    def translate(self, lines: Sequence[str], beam: int | None = None, **options) -> list[str]:
        """One translation per input line, in order; empty lines give empty strings."""
        request = Request(beam=beam, nbest=1, **options)
        return [best[0].text for best in self.translate_nbest(lines, request)]

    def translate_nbest(
        self, lines: Sequence[str], request: Request | None = None, **options
    ) -> list[list[Translation]]:
        """The `request.nbest` best translations of every line (best first), in input order;
        with `request.sampling`, that many samples of every line instead, in the order drawn.

        The options come as one `Request`, or as its fields by keyword
        (`translate_nbest(lines, beam=4, nbest=2, constraints=...)`).
        """
        if isinstance(lines, (str, bytes)):
            raise TypeError("translate: give a list of sentences (e.g. [text]), not one str")
        lines = list(lines)
        if not all(isinstance(line, str) for line in lines):
            raise TypeError("translate: every sentence must be a str")
        if request is not None and options:
            raise TypeError("translate_nbest: give a Request or its fields as keywords, not both")
        request = self.resolve(request or Request(**options))
        if request.glossary is not None:  # its terms join the constraints of the lines
            terms = request.glossary.constraints(lines, request.constraints)
            request = replace(request, constraints=terms, glossary=None)
        forms = None if self.text is None else self.text.read(lines, request.tgt_lang)
        if forms is not None:  # what the model reads; outputs are written back (given_back)
            lines = [form.text for form in forms]
        controls = line_controls(  # per line: None, or what its output must hold
            self.tgt_tokenizer,
            len(lines),
            request.constraints,
            request.prefixes,
            request.avoid,
            self.max_input_len + 1,
            request.first_line,
        )
        ids = self.encode(lines, request.tgt_lang, request.first_line)
        job = _Job(self, lines, ids, controls, forms, request)
        job.run()
        return job.results

    def resolve(self, request: Request) -> Request:
        """`request` checked against this model (its target languages and vocabulary), with
        its decode.* settings where the request leaves them None (`Request.resolved`)."""
        self.language_prefix(request.tgt_lang)
        return request.resolved(self.config.decode, self.tgt_tokenizer.vocab_size)

    def cross_attention(self, sources: list[list[int]], outputs: list[list[int]]) -> torch.Tensor:
        """What each output token attended to when it was chosen, as `alignment` reads it:
        decode.alignment_layer's cross-attention (by default every layer's), the mean over
        heads and models; (B, T, S)
        for sources from `encode` and outputs' tokens (rows: each token, then </s>; columns:
        each source piece, then <eos>)."""
        return cross_attention(self.models, sources, outputs, self.config.decode.alignment_layer)

    def describe(self) -> dict[str, Any]:
        """The model as the server's /info shows it: parameters (an ensemble's first model's),
        device, the linear layers' kind (as --prepack or --quantize made them), decode.*."""
        return {
            "parameters": self.parameters,
            "device": str(self.device),
            "linear_layers": linear_layers(self.model),
            "decode": asdict(self.config.decode),
        }

    def _search(
        self,
        lines: list[str],
        ids: list[list[int]],
        rows: list[int],
        controls: list[Controls | None],
        request: Request,
    ) -> list[list[Translation]]:
        """The entries of the lines `rows` (their text `lines`, source `ids`), searched as one
        batch with the strategy the request names: all steered (`controls`) or all plain."""
        cfg, alpha = self.config.decode, request.length_penalty
        assert alpha is not None, "a resolved request"
        steering = [c for c in controls if c is not None]
        src = source_batch(ids, rows).to(self.device)  # (B, S)
        limits = max_output_lengths(src, cfg.max_len_a, cfg.max_len_b, self.max_output_len)
        if steering:  # room for what the controls need
            needed = torch.tensor([c.needed_length() for c in steering], device=self.device)
            limits = torch.maximum(limits, needed)
        strategy = request.strategy([request.first_line + row for row in rows], steering)
        scoring = Scoring(alpha, cfg.length_penalty_kind, cfg.end_at_limit == "free")
        # A shortlist's rows for plain lines; steered ones (a prefix, terms) score every piece.
        shortlist = None if steering or self.shortlist is None else self.shortlist.rows(src)
        with autocast_context(self.device, self.dtype):
            hyps = generate(
                self.models, src, limits, strategy, scoring, request.use_cache, shortlist
            )
        for row, row_hyps, limit in zip(rows, hyps, limits.tolist(), strict=True):
            if not row_hyps:  # only steering can leave a line without any output
                raise UserError(
                    f"line {request.first_line + row}: no output of at most {limit - 1} tokens "
                    "starts with its prefix, holds every term and none of the avoided words"
                )
        entries = []
        for row_hyps in hyps:
            texts = self.tgt_tokenizer.decode([h.tokens for h in row_hyps])
            entries.append(
                [
                    Translation(_one_line(text), h.score, h.tokens)
                    for text, h in zip(texts, row_hyps, strict=True)
                ]
            )
        if request.alignment:
            lead = len(self.language_prefix(request.tgt_lang))
            self._align([lines[row] for row in rows], [ids[row] for row in rows], entries, lead)
        return entries

    def _align(
        self, lines: list[str], src: list[list[int]], entries: list[list[Translation]], lead: int
    ) -> None:
        """Fill the alignment of every entry of these lines (their text, source ids `src`, of
        which the first `lead` are tags): word numbers count the words of the line as given
        and of the output as written."""
        flat = [
            (s, source_words(self.src_tokenizer, text.strip(), s[lead:]), e)
            for text, s, line in zip(lines, src, entries, strict=True)
            for e in line
        ]
        attention = self.cross_attention(
            [s for s, _, _ in flat], [e.tokens for _, _, e in flat]
        )  # (outputs, T, S)
        for (_, src_words, entry), weights in zip(flat, attention, strict=True):
            out_words = output_words(self.tgt_tokenizer, entry.tokens)
            entry.alignment = word_alignment(weights[:, lead:], src_words, out_words)


@dataclass
class _Job:
    """One `translate_nbest` call: its lines as the model reads them (`lines`, source `ids`),
    each line's steering (`controls`) and form (`forms`: None with the text rules off), and
    the entries found, per line. Blank lines stay "": `nbest` empty entries, as many as any
    other line gets (with `alignment`, an empty one); a line of spans alone is given back as
    it is. The rest are searched in length batches; the lines whose output lost a number are
    read again without their numbers and searched after the rest, together."""

    translator: Translator
    lines: list[str]
    ids: list[list[int]]
    controls: list[Controls | None]
    forms: list[LineForm] | None
    request: Request
    results: list[list[Translation]] = field(default_factory=list)
    later: list[int] = field(default_factory=list)  # lines that lost a number

    def run(self) -> None:
        request = self.request
        self.results = [[] for _ in self.lines]
        todo = [row for row, seq in enumerate(self.ids) if seq]
        self._keep(sorted(set(range(len(self.lines))) - set(todo)))
        if request.on_batch is not None and len(todo) < len(self.lines):
            request.on_batch(len(self.lines) - len(todo))
        for batch in self._batches(todo):
            self._search(batch, first=True)
            if request.on_batch is not None:
                request.on_batch(len(batch))
        if self.later:
            self._numbers_again()

    def _numbers_again(self) -> None:
        """The lines that lost a number, read again without their numbers and searched."""
        text, tgt_lang = self.translator.text, self.request.tgt_lang
        assert text is not None and self.forms is not None, "lines read by the text rules"
        read_again(text, self.forms, self.lines, self.later, tgt_lang)
        again = self.translator.encode(
            [self.lines[row] for row in self.later], tgt_lang, warn=False
        )
        for row, seq in zip(self.later, again, strict=True):
            self.ids[row] = seq
        self._keep([row for row in self.later if not self.ids[row]])  # numbers alone
        for batch in self._batches([row for row in self.later if self.ids[row]]):
            self._search(batch, first=False)

    def _batches(self, rows: list[int]) -> list[list[int]]:
        lengths = [(len(seq) + 1,) for seq in self.ids]  # + <eos>
        return list(length_batches(lengths, self.request.line_budget(), order=rows))

    def _keep(self, rows: list[int]) -> None:
        """Blank lines, and lines of spans alone, given back as they are."""
        empty: Alignment | None = [] if self.request.alignment else None
        for row in rows:
            kept = (self.forms[row].kept if self.forms is not None else None) or ""
            self._done(row, [Translation(kept, 0.0, [], empty) for _ in range(self.request.nbest)])

    def _search(self, batch: list[int], first: bool) -> None:
        # Steered lines search apart, so plain lines get exactly the plain search.
        plain = [row for row in batch if self.controls[row] is None]
        steered = [row for row in batch if self.controls[row] is not None]
        for rows in (plain, steered):
            if not rows:
                continue
            steering = [self.controls[row] for row in rows]
            found = self.translator._search(self.lines, self.ids, rows, steering, self.request)
            if self.forms is not None:
                lost = lost_numbers(self.forms, rows, found) if first else []
                self.later += lost
                keep = [k for k, row in enumerate(rows) if row not in lost]
                rows, found = [rows[k] for k in keep], [found[k] for k in keep]
                found = given_back(
                    self.translator, self.forms, self.lines, self.ids, rows, found, self.request
                )
            for row, entries in zip(rows, found, strict=True):
                self._done(row, entries)

    def _done(self, row: int, entries: list[Translation]) -> None:
        self.results[row] = entries
        if self.request.on_line is not None:
            self.request.on_line(row, entries)


def _one_line(text: str) -> str:
    """`text` without line breaks: a model may emit pieces that decode to \\n or \\r, and the
    output must keep one line per input line."""
    return _LINE_BREAKS.sub(" ", text)
