"""The config schema's `data` section: which text a run trains on, as files or a named corpus,
for one direction or many (`data.pairs`, languages on each file entry), the rules that clean it
(`data.filters`, also per corpus) and the noise added for robustness (`data.augment`).
`attn_mt.config.schema` holds the rest of the schema; the conventions (`key`, `group`, `validate()`)
are explained there.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from attn_mt.config.keys import group, key, reject
from attn_mt.errors import ConfigError

NAMED_CORPORA = ("multi30k",)
# The languages of each named corpus (`data.pairs` may pair any two of them).
CORPUS_LANGUAGES = {"multi30k": ("de", "en", "fr", "cs")}
# A language code (`de`, `pt_BR`); its target-language tag is `<2de>` (`language_tag`).
_LANG = re.compile(r"[a-z]{2,3}(_[A-Za-z0-9]+)?")
# A tag is a piece of its own: never one SentencePiece has already (special, byte <0xNN>).
_TAG = re.compile(r"(?!<(s|unk|pad)>|<0x[0-9A-Fa-f]{2}>)<[A-Za-z0-9_-]+>")


@dataclass
class SplitFiles:
    """One parallel split: a source file and a target file, plain text or .gz."""

    src: str | None = key(None, "path to the source-language file")
    tgt: str | None = key(None, "path to the target-language file")


def language_tag(lang: str) -> str:
    """The piece put before a source sentence to ask for target language `lang`: `<2lang>`."""
    return f"<2{lang}>"


_LANGUAGE_RULE = (lambda v: _LANG.fullmatch(v), "must be a language code such as de or pt_BR")


@dataclass
class ValidCorpus:
    """One direction's validation files (`data.valid` given as a list of these)."""

    src: str | None = key(None, "path to the source-language file")
    tgt: str | None = key(None, "path to the target-language file")
    src_lang: str | None = key(None, "its source language", rule=_LANGUAGE_RULE)
    tgt_lang: str | None = key(None, "its target language", rule=_LANGUAGE_RULE)


@dataclass
class FilterConfig:
    """The rules that drop noisy pairs (`attn-mt clean` shows what each one drops). Every rule
    is off by default; docs/bigger-corpora.md gives the settings for a web corpus. A rule's
    switch is the key named as it, its settings the keys `RULE_*`; each rule is a class of
    `attn_mt.data.rules`, and a pair is counted under the first rule that drops it, in the
    order of the keys below."""

    max_chars: int = key(0, "drop pairs with a side over N characters (0 = off)", off=0, ge=1)
    ratio: float = key(
        0.0,
        "drop pairs whose longer side has over N times the characters of the other (a Han "
        "character counts 3, kana or Hangul 2; pairs of two sides under 20 characters pass; "
        "0 = off)",
        off=0,
        ge=1,
    )
    markup: bool = key(False, "drop pairs with HTML tags, URLs, e-mail addresses, ©, menu bars")
    long_words: int = key(
        0,
        "drop pairs with a word over N characters (0 = off; sides in zh, ja, th, lo, km, my "
        "are not judged: they have no spaces)",
        off=0,
        ge=2,
    )
    digits: bool = key(False, "drop pairs whose sides hold different digits 1-9 (any order)")
    copy: bool = key(False, "drop pairs whose target (nearly) repeats the source")
    copy_share: float = key(
        0.8, "copy: the share of distinct words both sides hold that counts as a copy", gt=0, le=1
    )
    script: bool = key(
        False, "drop pairs with a side under script_share letters of its language's script"
    )
    script_share: float = key(0.5, "script: the least share of a side's letters", gt=0, le=1)
    langid: bool = key(
        False, "drop pairs with a side py3langid finds is not in its language (see langid_*)"
    )
    langid_min_chars: int = key(
        15, "langid: sides with fewer non-space characters are not judged (unreliable)", ge=1
    )
    langid_min_prob: float = key(
        0.01, "langid: a side is dropped below this probability of its language", gt=0, lt=1
    )
    dedup: bool = key(False, "drop a pair equal to one kept before in its corpus (spaces ignored)")
    score: str | None = key(
        None,
        "a model (run folder or .pt) whose forced decoding scores each pair left; "
        "`attn-mt clean` only (null = off)",
    )
    score_backward: str | None = key(
        None, "score: a model of the opposite direction, for dual cross-entropy (null = none)"
    )
    score_min: float = key(
        0.1,
        "score: drop pairs under exp(-H), H the cross-entropy per token (with score_backward "
        "abs(H_fwd - H_bwd) + (H_fwd + H_bwd) / 2)",
        gt=0,
        lt=1,
    )

    def switches(self) -> dict[str, bool]:
        """Whether each rule is on, by its switch: true, a number other than 0, a model named
        (a key `RULE_*` is a setting of the rule RULE, not a switch)."""
        names = [f.name for f in dataclasses.fields(self)]
        return {
            name: getattr(self, name) not in (None, False, 0)
            for name in names
            if not any(name.startswith(f"{rule}_") for rule in names)
        }

    def any(self) -> bool:
        """Whether any rule is on."""
        return any(self.switches().values())

    def validate(self, where: str) -> None:
        """A backward model goes with a forward one."""
        if self.score_backward is not None and self.score is None:
            reject(f"{where}.score_backward", self.score_backward, f"needs {where}.score")


@dataclass
class AugmentConfig:
    """Training pairs changed the way people type (OpusTrainer's modifiers), each a share of the
    pairs, drawn from train.seed and the pair's place in its corpus when the data is prepared."""

    uppercase: float = key(
        0.0,
        "share of pairs written in capitals, both sides (text without case unchanged)",
        ge=0,
        le=1,
    )
    titlecase: float = key(0.0, "share of pairs with each word capitalized, both sides", ge=0, le=1)
    no_final_punct: float = key(
        0.0, "share of pairs whose final punctuation is removed, both sides", ge=0, le=1
    )
    typos: float = key(
        0.0,
        "share of pairs with typos in the source (a character swapped, dropped, inserted or "
        "repeated), the target left right",
        ge=0,
        le=1,
    )

    def any(self) -> bool:
        """Whether any share is above 0."""
        return any((self.uppercase, self.titlecase, self.no_final_punct, self.typos))

    def validate(self) -> None:
        """A pair is upper-cased or title-cased, not both: their shares add up to at most 1."""
        if self.uppercase + self.titlecase > 1:
            reject(
                "data.augment.titlecase",
                self.titlecase,
                f"with data.augment.uppercase {self.uppercase:g} the shares add up to over 1",
            )


@dataclass
class TrainCorpus:
    """One corpus of a training mix (`data.train` given as a list of these)."""

    src: str | None = key(None, "path to the source-language file")
    tgt: str | None = key(None, "path to the target-language file")
    weight: float = key(
        1.0, "passes per epoch: 2 = twice, 0.5 = a seeded half drawn anew each epoch", gt=0
    )
    tag: str | None = key(
        None,
        "a token like <bt> put before each source sentence of this corpus",
        rule=(
            _TAG.fullmatch,
            "must look like <name> (letters, digits, _ or -), not a piece SentencePiece has "
            "(<s>, <unk>, <pad>, <0xNN>)",
        ),
    )
    src_lang: str | None = key(None, "its source language (multilingual)", rule=_LANGUAGE_RULE)
    tgt_lang: str | None = key(None, "its target language (multilingual)", rule=_LANGUAGE_RULE)
    filters: FilterConfig | None = key(
        None, "this corpus's own rules, instead of data.filters (null = data.filters)"
    )

    def validate(self, where: str) -> None:
        """Both files are given (a mapping's files may come from `data.dataset` instead)."""
        for side in ("src", "tgt"):
            if getattr(self, side) is None:
                raise ConfigError(f"{where}.{side}: missing; every corpus needs src and tgt files")


@dataclass
class DataConfig:
    """Where the parallel text comes from and which pairs are kept for training."""

    dataset: str | None = key(
        None,
        "a named corpus (multi30k) or null to use the files below",
        rule=(NAMED_CORPORA.__contains__, f"must be one of {list(NAMED_CORPORA)} or null"),
    )
    src_lang: str = key("de", "source language code")
    tgt_lang: str = key("en", "target language code")
    train: SplitFiles | list[TrainCorpus] = group(
        SplitFiles, "training files, or a list of corpora {src, tgt, weight, tag} mixed by weight"
    )
    valid: SplitFiles | list[ValidCorpus] = group(
        SplitFiles, "validation files (BLEU, early stop), or a list {src, tgt, src_lang, tgt_lang}"
    )
    valid_general: SplitFiles = group(
        SplitFiles,
        "a second validation set, watched and never selecting best.pt: a fine-tuned model's "
        "general domain, where forgetting shows (null files: none)",
    )
    test: SplitFiles = group(SplitFiles, "test files (`evaluate --split test`)")
    max_len: int = key(
        128,
        "training pairs with more subword tokens on either side are dropped (after data.filters)",
        ge=1,
    )
    max_len_ratio: float = key(
        0.0,
        "drop pairs whose longer side has over N times the tokens (0 = off; after data.filters)",
        off=0,
        ge=1,
    )
    filters: FilterConfig = group(FilterConfig, "rules that drop noisy training pairs")
    augment: AugmentConfig = group(AugmentConfig, "training pairs changed as people type")
    prepared_dir: str | None = key(None, "token shards go under it (null = the user cache folder)")
    pairs: list[str] = dataclasses.field(
        default_factory=list,
        metadata={"doc": "directions of the named corpus for one multilingual model: [de-en, ...]"},
    )
    temperature: float = key(
        1.0, "multilingual mix: corpus shares p ~ n^(1/T) (1 = by size; larger flattens)", gt=0
    )

    def validate(self, files: bool = True) -> None:
        """Every split has its files unless a named corpus supplies them; two languages; the
        second validation set (a bilingual run's) has both its files or neither.
        `files` False: the section only names the languages and directions of a model (a
        checkpoint's config: an imported model was trained on no files of attn-mt's)."""
        self._validate_languages(files)
        if isinstance(self.train, list):
            if not self.train:
                raise ConfigError("data.train: an empty list; give at least one corpus")
            for i, corpus in enumerate(self.train):
                corpus.validate(f"data.train[{i}]")
        for i, entry in enumerate(self.valid if isinstance(self.valid, list) else []):
            for side in ("src", "tgt"):
                if getattr(entry, side) is None:
                    raise ConfigError(f"data.valid[{i}].{side}: missing; give src and tgt files")
        if self.dataset is None and files:
            for split in ("train", "valid") if isinstance(self.train, SplitFiles) else ("valid",):
                files = getattr(self, split)
                for side in ("src", "tgt"):
                    if isinstance(files, SplitFiles) and getattr(files, side) is None:
                        raise ConfigError(
                            f"data.{split}.{side}: missing; give the file, "
                            "or set data.dataset to a named corpus such as multi30k"
                        )
        if self.src_lang == self.tgt_lang:
            reject("data.tgt_lang", self.tgt_lang, "must differ from data.src_lang")
        general = self.valid_general
        if (general.src is None) != (general.tgt is None):
            side = "tgt" if general.tgt is None else "src"
            raise ConfigError(f"data.valid_general.{side}: missing; give src and tgt files")
        if general.src is not None and len(self.directions()) > 1:
            raise ConfigError(
                "data.valid_general: one direction's files, for a bilingual run; a multilingual "
                "run validates each direction in data.valid"
            )
        self.augment.validate()
        self.filters.validate("data.filters")
        for i, corpus in enumerate(self.train if isinstance(self.train, list) else []):
            if corpus.filters is not None:
                corpus.filters.validate(f"data.train[{i}].filters")

    def _validate_languages(self, files: bool = True) -> None:
        """data.pairs names two languages of its named corpus; file entries give both
        languages or neither, and a multilingual file mix gives its validation per direction."""
        for i, pair in enumerate(self.pairs):
            where = f"data.pairs[{i}]"
            if self.dataset is None and files:
                raise ConfigError(
                    f"{where}: pairs take their files from a named corpus (data.dataset); for "
                    "files give src_lang and tgt_lang on each data.train and data.valid entry"
                )
            src, _, tgt = str(pair).partition("-")
            known = CORPUS_LANGUAGES[self.dataset] if self.dataset else [src, tgt]
            if not _LANG.fullmatch(src) or not _LANG.fullmatch(tgt):
                reject(where, pair, "must be two language codes joined by -, e.g. de-en")
            if src not in known or tgt not in known:
                reject(where, pair, f"{self.dataset} has the languages {', '.join(known)}")
            if src == tgt:
                reject(where, pair, "a pair needs two different languages")
        if self.pairs and isinstance(self.train, list):
            raise ConfigError(
                "data.pairs: take the files of data.dataset; leave data.train out, or give files "
                "with src_lang and tgt_lang on each data.train entry instead"
            )
        if len(set(self.pairs)) < len(self.pairs):
            reject("data.pairs", self.pairs, "names a pair twice")
        entries: list[tuple[str, TrainCorpus | ValidCorpus]] = []
        entries += [("data.train", c) for c in self.train] if isinstance(self.train, list) else []
        entries += [("data.valid", c) for c in self.valid] if isinstance(self.valid, list) else []
        given = [(w, c) for w, c in entries if c.src_lang or c.tgt_lang]
        for where, c in given:
            if not (c.src_lang and c.tgt_lang) or c.src_lang == c.tgt_lang:
                raise ConfigError(
                    f"{where}: an entry with {c.src} needs src_lang and tgt_lang, two different "
                    "languages"
                )
        if given and len(given) < len(entries):
            raise ConfigError(
                "data.train, data.valid: give src_lang and tgt_lang on every entry, or on none"
            )
        if given and not isinstance(self.valid, list):
            raise ConfigError(
                "data.valid: a multilingual data.train needs its validation per direction: a "
                "list of {src, tgt, src_lang, tgt_lang}"
            )

    def directions(self) -> list[tuple[str, str]]:
        """The (source, target) languages trained: data.pairs, else those of the data.train
        entries, else (src_lang, tgt_lang)."""
        if self.pairs:
            return [tuple(p.split("-", 1)) for p in self.pairs]  # type: ignore[misc]
        if isinstance(self.train, list) and self.train[0].src_lang:
            found = [(c.src_lang, c.tgt_lang) for c in self.train]
            return list(dict.fromkeys(found))  # type: ignore[arg-type]
        return [(self.src_lang, self.tgt_lang)]

    def languages(self) -> list[str]:
        """Every language of the model, in order of first use (a source before its target)."""
        return list(dict.fromkeys(lang for pair in self.directions() for lang in pair))

    def in_words(self) -> str:
        """The directions as a person reads them: 'de -> en', or 'de-en, en-de (2 directions)'."""
        found = self.directions()
        if len(found) == 1:
            return f"{found[0][0]} -> {found[0][1]}"
        return f"{', '.join(f'{s}-{t}' for s, t in found)} ({len(found)} directions)"

    def target_languages(self) -> list[str]:
        """The languages the model translates into, in order of first use."""
        return list(dict.fromkeys(tgt for _, tgt in self.directions()))

    def language_tags(self) -> bool:
        """Whether a `<2xx>` tag leads every source: the model has several target languages."""
        return len(self.target_languages()) > 1

    def filters_of(self, corpus: TrainCorpus) -> FilterConfig:
        """The rules of one training corpus: its own `filters`, else data.filters."""
        return corpus.filters if corpus.filters is not None else self.filters

    def weights(self) -> list[float]:
        """Each training corpus's weight (one corpus of weight 1 when `train` is a mapping,
        one per pair with data.pairs)."""
        if isinstance(self.train, list):
            return [c.weight for c in self.train]
        return [1.0] * max(len(self.pairs), 1)

    def tags(self) -> list[str]:
        """The distinct corpus and target-language tags, in order of first use (reserved
        tokenizer pieces)."""
        corpora = self.train if isinstance(self.train, list) else []
        tags = [language_tag(lang) for lang in self.target_languages()] * self.language_tags()
        return list(dict.fromkeys(tags + [c.tag for c in corpora if c.tag]))
