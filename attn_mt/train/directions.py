"""Validation of a multilingual run: each direction validated on its own (loss, BLEU, chrF,
and the off-target rate: the share of outputs not in the language asked for), and their
mean, which picks best.pt and stops early as a bilingual run's one figure does."""

from __future__ import annotations

from collections.abc import Callable

from attn_mt.config import TrainConfig
from attn_mt.decode.translator import Translator
from attn_mt.langid import off_target_rate
from attn_mt.train.corpus import Corpus
from attn_mt.train.runlog import Validation

# The figures averaged over the directions (`sentences` is summed).
MEAN_KEYS = ("loss", "ppl", "bleu", "chrf", "off_target")


def validate_directions(
    validate: Callable[[Translator, Corpus, TrainConfig, Callable], Validation],
    translator: Translator,
    corpus: Corpus,
    t: TrainConfig,
    on_progress: Callable[[str, int, int], None],
) -> Validation:
    """`validate` each direction of `corpus.pairs`; the result's metrics are their mean and
    its `pairs` each direction's own figures."""
    languages = translator.config.data.target_languages()
    languages += [src for src, _ in translator.config.data.directions()]
    per_pair: dict[str, dict[str, float]] = {}
    samples: list[tuple[str, str, str]] = []
    seconds: dict[str, float] = {}
    for pair, direction in corpus.pairs.items():
        result = validate(translator, direction, t, on_progress)
        tgt_lang = str(direction.valid_tgt_lang)
        rate = off_target_rate(result.hypotheses, tgt_lang, languages)
        per_pair[pair] = result.metrics | ({"off_target": rate} if rate is not None else {})
        samples += result.samples[:1]
        for phase, took in result.seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + took
    metrics = {
        name: sum(m[name] for m in per_pair.values()) / len(per_pair)
        for name in MEAN_KEYS
        if all(name in m for m in per_pair.values())
    }
    metrics["sentences"] = sum(m["sentences"] for m in per_pair.values())
    return Validation(metrics, samples[: max(t.samples, 0)], seconds, pairs=per_pair)
