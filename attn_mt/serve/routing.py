"""Which loaded model answers a language pair. `serve --model` may be given more than once: the
models of one set of directions are loaded as one ensemble (as `translate` loads them), models
of other directions beside it, each answering its own pairs; a multilingual model answers
every pair it has. A request names its pair (either side may be left out where only one pair
fits), or `auto` for the source, identified by py3langid among every language it knows: a
language no model here translates from is refused, named.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.errors import UserError

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translator

Pair = tuple[str, str]

# Names of the languages of the shipped corpora; another code is shown as itself.
LANGUAGE_NAMES = {
    "cs": "Czech",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "it": "Italian",
    "ro": "Romanian",
    "ru": "Russian",
}
DETECTED = 3  # languages /detect names, likeliest first


def language_name(code: str) -> str:
    """A language's name, as /languages shows it (a code without one: the code)."""
    return LANGUAGE_NAMES.get(code, code)


@dataclass(eq=False)
class Route:
    """One loaded translator (a model, or an ensemble of models of one set of directions) and
    the checkpoints it was loaded from."""

    translator: Translator
    paths: list[Path]

    @property
    def directions(self) -> list[Pair]:
        return self.translator.config.data.directions()

    def describe(self) -> dict[str, Any]:
        """The route as /info shows it: its checkpoints, directions and the model."""
        return {
            "paths": [str(p) for p in self.paths],
            "directions": ["-".join(d) for d in self.directions],
            **self.translator.describe(),
        }


def load_routes(paths: Sequence[Path], load: Callable[[list[Path]], Translator]) -> list[Route]:
    """The routes of the checkpoints `paths`, those of one set of directions loaded together by
    `load` (an ensemble), in the order given. Two routes may not share a pair: a model that
    would answer a pair another one answers, but cannot join it in an ensemble, is refused."""
    if len(paths) == 1:
        return [Route(load(list(paths)), list(paths))]
    groups: dict[tuple[Pair, ...], list[Path]] = {}
    for path in paths:
        directions = checkpoint_directions(path) or load([path]).config.data.directions()
        groups.setdefault(tuple(directions), []).append(path)
    owner: dict[Pair, Path] = {}
    for served, group in groups.items():
        for pair in served:
            if pair in owner:
                raise UserError(
                    f"--model {group[0]}: it translates {'-'.join(pair)}, as --model "
                    f"{owner[pair]} does, but their directions differ "
                    "(an ensemble needs the same ones); serve one of them"
                )
            owner[pair] = group[0]
    return [Route(load(group), group) for group in groups.values()]


def checkpoint_directions(path: Path) -> list[Pair] | None:
    """The directions a checkpoint translates, read from its config without reading its
    weights (mapped, not loaded); None for a file that cannot be read so (`load` says why)."""
    import torch

    from attn_mt.checkpoint import checkpoint_config
    from attn_mt.paths import resolve_checkpoint

    checkpoint = resolve_checkpoint(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        return checkpoint_config(state, checkpoint).data.directions()
    except Exception:  # damaged, foreign or of an older format: for `load` to read or refuse
        return None


class Router:
    """The routes a server holds, and which one answers a pair."""

    def __init__(self, routes: Sequence[Route]):
        self.routes = list(routes)
        self.owner = {pair: route for route in self.routes for pair in route.directions}

    @property
    def pairs(self) -> list[Pair]:
        """Every pair served, in the order of the routes."""
        return list(self.owner)

    def source_languages(self) -> list[str]:
        return list(dict.fromkeys(src for src, _ in self.pairs))

    def find(
        self,
        src: str | None,
        tgt: str | None,
        names: tuple[str, str] = ("src_lang", "tgt_lang"),
    ) -> tuple[Route, str | None, str]:
        """The route that answers `src` -> `tgt` (None: any that fits, if only one route
        does), the target language to ask its translator for (None for a model of one target
        language) and the source language; a UserError naming the options `names` if no
        route or more than one fits."""
        fits = [(s, t) for s, t in self.pairs if src in (None, s) and tgt in (None, t)]
        routes = list(dict.fromkeys(self.owner[pair] for pair in fits))
        served = ", ".join("-".join(pair) for pair in self.pairs)
        if not routes:
            asked = f"{src or '*'} -> {tgt or '*'}"
            raise UserError(f"{asked}: not a pair this server translates; it translates {served}")
        if len(routes) > 1:
            missing = " and ".join(n for n, v in zip(names, (src, tgt), strict=True) if v is None)
            raise UserError(f"{missing}: give it; different models translate {served}")
        route = routes[0]
        targets = list(dict.fromkeys(t for _, t in fits))
        sources = list(dict.fromkeys(s for s, _ in fits))
        if len(targets) > 1:
            raise UserError(f"{names[1]}: give one of {', '.join(targets)}")
        tagged = route.translator.config.data.language_tags()
        return route, targets[0] if tagged else None, sources[0]

    def languages(self) -> list[dict[str, Any]]:
        """LibreTranslate's /languages: every language with the ones it translates into."""
        codes = dict.fromkeys(lang for pair in self.pairs for lang in pair)
        return [
            {
                "code": code,
                "name": language_name(code),
                "targets": [tgt for src, tgt in self.pairs if src == code],
            }
            for code in codes
        ]

    def detect(self, text: str) -> list[dict[str, Any]]:
        """LibreTranslate's /detect: the DETECTED languages `text` is likeliest in, among all
        py3langid knows (a served language by its served code), with py3langid's probability
        in percent (`confidence`), likeliest first."""
        from attn_mt.langid import base_code, identify

        served = {base_code(lang): lang for lang in reversed(self.source_languages())}
        return [
            {"confidence": round(100 * p, 1), "language": served.get(lang, lang)}
            for lang, p in identify(text)[:DETECTED]
        ]

    def source_of(self, text: str) -> dict[str, Any]:
        """`auto`: the language /detect finds `text` likeliest in, if a model here translates
        from it; a UserError naming the language otherwise. A blank text is in the first
        source language (it translates to blank in any)."""
        from attn_mt.langid import known

        sources = self.source_languages()
        if not text.strip():
            return {"confidence": 0.0, "language": sources[0]}
        found = self.detect(text)[0]
        if found["language"] in sources:
            return found
        lang = found["language"]
        unseen = [source for source in sources if not known(source)]
        never = f"; py3langid never finds {', '.join(unseen)}: name the source" if unseen else ""
        raise UserError(
            f"source auto: the text is in {language_name(lang)} ({lang}, "
            f"{found['confidence']}% by py3langid), which no model here translates from; "
            f"the sources are {', '.join(sources)}{never}"
        )
