"""`data.augment`: training pairs changed the way people type, as OpusTrainer's modifiers do
(UpperCase, TitleCase, Typos) and one more (no final punctuation); title case and final
punctuation are the text rules' (`attn_mt.text`), which translation reads lines by too.

Each pair's draws come from its own generator, seeded by (train.seed, corpus, line): the same
pair is changed the same way in every process and on every machine, whatever the chunking or the
number of workers. `prepare` writes the changed pairs into the shards (see `Augmenter`).
"""

from __future__ import annotations

import random

from attn_mt.config.data import AugmentConfig
from attn_mt.text.casing import title_case
from attn_mt.text.normalize import without_final_punct

__all__ = ["Augmenter", "title_case", "with_typos", "without_final_punct"]


class Augmenter:
    """The changes of `data.augment`, drawn per pair.

    Where: at prepare time, into the shards. A batch is cut by its pairs' token lengths, and an
    ALL CAPS line has two to three times the pieces of its lower-case self: changed on the fly,
    a batch would outgrow its token budget (and a GPU its memory), while in the shards the
    lengths are known before batching. The training loop pays nothing, and resume stays exact
    because the shards never change. The price: a pair is changed the same way in every
    epoch (another train.seed draws others).
    """

    def __init__(self, config: AugmentConfig, seed: int):
        self.config, self.seed = config, seed

    def pair(self, src: str, tgt: str, corpus: int, line: int) -> tuple[str, str]:
        """Pair `line` (0-based) of corpus `corpus`, changed as its draws say."""
        c = self.config
        rng = random.Random((self.seed << 96) | (corpus << 64) | line)
        case, punct, typos = rng.random(), rng.random(), rng.random()
        if case < c.uppercase:
            src, tgt = src.upper(), tgt.upper()
        elif case < c.uppercase + c.titlecase:
            src, tgt = title_case(src), title_case(tgt)
        if punct < c.no_final_punct:
            src, tgt = without_final_punct(src), without_final_punct(tgt)
        if typos < c.typos:
            src = with_typos(src, rng)
        return src, tgt


def with_typos(line: str, rng: random.Random) -> str:
    """`line` with a typo per started 40 characters (at most 3), each at a letter: two
    letters swapped, one dropped, one typed twice, or a letter of the line inserted."""
    chars = list(line)
    for _ in range(min(3, 1 + len(line) // 40)):
        letters = [i for i, c in enumerate(chars) if c.isalpha()]
        if len(letters) < 2:
            break
        at = rng.choice(letters)
        kind = rng.randrange(4)
        swap = at + 1 < len(chars) and chars[at + 1].isalpha() and chars[at + 1] != chars[at]
        if kind == 0 and swap:
            chars[at], chars[at + 1] = chars[at + 1], chars[at]
        elif kind <= 1:  # a swap that would change nothing drops the letter instead
            del chars[at]
        elif kind == 2:
            chars.insert(at, chars[at])
        else:
            chars.insert(at, chars[rng.choice(letters)])
    return "".join(chars)
