"""The parity check of `export --format hf`: the folder, loaded as a user loads it, against
attn-mt on a fixed sample (tokenizer ids, log-probabilities, greedy and beam outputs); the
sample of random sources that `export --format ct2`'s check (`ct2_parity`) shares."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from attn_mt.decode.generate import max_output_lengths
from attn_mt.decode.translator import Translator
from attn_mt.model.vocab import BOS_ID, EOS_ID

# The parity check: teacher-forced log-probabilities may differ by this much (float32
# rounding of the same arithmetic in another order), outputs not at all.
LOGPROB_TOLERANCE = 1e-4
PARITY_SOURCES = 12  # random sources of 1-12 tokens (`random_sources`), drawn with this seed:
PARITY_SEED = 0
# The tokenizer check: ids must equal ours on these and on the parity sample's text.
TOKENIZER_SAMPLE = [
    "Ein Mann fährt Fahrrad.",
    "  two  spaces, a tab\there and trailing space ",
    "Ünïcödé: naïve café, Straße, 東京, Привет, مرحبا, 🙂👍",
    "</s> <pad> <unk> <s> >>de<< are plain text to SentencePiece",
    "<2de> <2en> <bt>, tags' strings in a sentence, are text too",
    "",
]


@dataclass
class Parity:
    """How the exported model agrees with attn-mt on the fixed sample."""

    sentences: int
    greedy_same: int
    beam_same: int
    beam: int
    max_logprob_diff: float
    tokenizer_same: int
    tokenizer_lines: int

    @property
    def ok(self) -> bool:
        """Every output and tokenization identical, log-probabilities within tolerance."""
        return (
            self.greedy_same == self.beam_same == self.sentences
            and self.tokenizer_same == self.tokenizer_lines
            and self.max_logprob_diff <= LOGPROB_TOLERANCE
        )

    def __str__(self) -> str:
        return (
            f"greedy {self.greedy_same}/{self.sentences} and beam {self.beam} "
            f"{self.beam_same}/{self.sentences} outputs identical, log-probabilities within "
            f"{self.max_logprob_diff:.1e} (tolerance {LOGPROB_TOLERANCE:.0e}), tokenizer ids "
            f"identical on {self.tokenizer_same}/{self.tokenizer_lines} lines"
        )


@torch.no_grad()
def check_parity(tf, translator: Translator, folder: Path) -> Parity:
    """Load `folder` with `tf` (the transformers package) as a user would (offline, no remote
    code) and compare it with attn-mt on a fixed sample: tokenizer ids, teacher-forced
    log-probabilities, and greedy and beam outputs against `Translator.translate_nbest`'s.

    The sample's sentences are random piece ids written as text; both models read the ids
    `Translator.encode` gives that text (a multilingual model's with the tag of its first
    target language). Each sentence gets its own max_length, our a * S + b limit. Beam search
    runs with length penalty 0 on both sides, where both rank by the summed log-probability,
    and with our rule at the limit (`_end_at_limit`).
    """
    translator = models_only(translator)
    hf_model = tf.AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model, cfg = translator.model, translator.config.decode
    vocab = translator.tgt_tokenizer.vocab_size
    gen = torch.Generator().manual_seed(PARITY_SEED)
    texts = random_sources(translator, gen)
    # The tokenizer, line for line: the exported one against our SentencePiece model.
    lines = TOKENIZER_SAMPLE + texts
    ours_ids = [ids + [EOS_ID] for ids in translator.src_tokenizer.encode(lines)]
    if translator.config.data.language_tags():  # `>>xx<< text`: <2xx> before the text's ids
        for lang in translator.target_languages:
            lines.append(f">>{lang}<< {TOKENIZER_SAMPLE[0]}")
            ours_ids.append([*translator.encode([TOKENIZER_SAMPLE[0]], lang)[0], EOS_ID])
    theirs_ids = tokenizer(lines)["input_ids"]
    tokenizer_same = sum(a == b for a, b in zip(theirs_ids, ours_ids, strict=True))

    lang = translator.target_languages[0]
    sample = [(t, ids) for t, ids in zip(texts, translator.encode(texts, lang), strict=True) if ids]
    beam = max(cfg.beam, 2)
    greedy_same = beam_same = 0
    max_diff = 0.0
    for text, ids in sample:
        src = torch.tensor([ids + [EOS_ID]])  # (1, S)
        limit = int(max_output_lengths(src, cfg.max_len_a, cfg.max_len_b, model.max_positions))
        options = dict(max_length=limit + 1, do_sample=False, early_stopping=False)
        [[ours]] = translator.translate_nbest([text], beam=1, tgt_lang=lang)
        theirs = hf_model.generate(src, num_beams=1, **options)[0].tolist()
        greedy_same += theirs == [BOS_ID, *ours.tokens, EOS_ID]
        [[ours]] = translator.translate_nbest([text], beam=beam, length_penalty=0.0, tgt_lang=lang)
        theirs = hf_model.generate(
            src,
            num_beams=beam,
            length_penalty=0.0,
            forced_eos_token_id=None,
            logits_processor=_end_at_limit(tf, limit),
            **options,
        )
        beam_same += theirs[0].tolist() == [BOS_ID, *ours.tokens, EOS_ID]
        tgt_in = torch.tensor([[BOS_ID, *torch.randint(4, vocab, (limit,), generator=gen)]])
        ours_lp = model(src, tgt_in).log_softmax(-1)  # (1, T, V)
        theirs_lp = hf_model(input_ids=src, decoder_input_ids=tgt_in).logits.log_softmax(-1)
        max_diff = max(max_diff, float((ours_lp - theirs_lp).abs().max()))
    return Parity(len(sample), greedy_same, beam_same, beam, max_diff, tokenizer_same, len(lines))


def models_only(translator: Translator) -> Translator:
    """The translator with the lines read as given (decode.recase and decode.protect off) and
    every piece scored (no decode.shortlist): the parity checks compare the models' searches,
    which an exported model carries, not the text rules around them."""
    plain = copy.copy(translator)
    plain.text, plain.shortlist = None, None
    return plain


def random_sources(translator: Translator, gen: torch.Generator | None = None) -> list[str]:
    """The parity checks' fixed sample: PARITY_SOURCES sources of 1-12 random source pieces
    (not special ones), written as text; drawn from `gen` (by default one seeded PARITY_SEED)."""
    gen = torch.Generator().manual_seed(PARITY_SEED) if gen is None else gen
    sources = [
        torch.randint(4, translator.src_tokenizer.vocab_size, (n,), generator=gen).tolist()
        for n in torch.randint(1, 13, (PARITY_SOURCES,), generator=gen).tolist()
    ]
    return translator.src_tokenizer.decode(sources)


def _end_at_limit(tf, limit: int):
    """attn-mt's rule at the output limit as a logits processor: the last token must be </s>,
    scored by its own log-probability (transformers' forced_eos_token_id scores it 0, which
    changes how beams that reach the limit rank)."""

    class EndAtLimit(tf.LogitsProcessor):
        def __call__(self, prefix: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if prefix.size(1) < limit:  # <bos> and fewer than limit - 1 tokens
                return scores
            only_eos = torch.full_like(scores, float("-inf"))  # (N, V)
            only_eos[:, EOS_ID] = scores[:, EOS_ID]
            return only_eos

    return tf.LogitsProcessorList([EndAtLimit()])
