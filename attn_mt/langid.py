"""The off-target rate of a multilingual model: the share of its outputs that are not in the
language asked for, as py3langid (langid.py's model, shipped with the package) identifies them.

The identifier chooses among the model's own languages only: the failure it measures is a
model answering in another language it knows (e.g. English asked for French), and short
sentences identified among ~100 languages are too often taken for a third one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any


def _code(lang: str) -> str:
    """The ISO 639-1 code py3langid knows a language by: `pt_BR` -> `pt`."""
    return lang.split("_")[0]


@lru_cache(maxsize=8)
def _identifier(languages: tuple[str, ...]) -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    identifier.set_languages([lang for lang in languages if lang in identifier.nb_classes])
    return identifier


def off_target_rate(outputs: Sequence[str], lang: str, languages: Sequence[str]) -> float | None:
    """Percent of the non-blank `outputs` identified as another of `languages` than `lang`;
    None when there is nothing to judge or py3langid does not know `lang`."""
    codes = tuple(sorted({_code(x) for x in [*languages, lang]}))
    identifier = _identifier(codes)
    if _code(lang) not in identifier.nb_classes or len(identifier.nb_classes) < 2:
        return None
    judged = [line for line in outputs if line.strip()]
    if not judged:
        return None
    wrong = sum(identifier.classify(line)[0] != _code(lang) for line in judged)
    return 100 * wrong / len(judged)
