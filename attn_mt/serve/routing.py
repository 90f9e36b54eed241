"""Which loaded model answers a language pair. `serve --model` may be given more than once: the
models of one set of directions are loaded as one ensemble (as `translate` loads them), models
of other directions beside it, each answering its own pairs; a multilingual model answers
every pair it has. A request names its pair (either side may be left out where only one pair
fits), or `auto` for the source, identified among the served source languages (py3langid).
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
                "name": LANGUAGE_NAMES.get(code, code),
                "targets": [tgt for src, tgt in self.pairs if src == code],
            }
            for code in codes
        ]

    def detect(self, text: str) -> list[dict[str, Any]]:
        """The served source languages `text` may be in, likeliest first, as LibreTranslate's
        /detect gives them (`confidence` in percent): ranked by py3langid among those it knows
        (a language it does not know is never found); one served source language is certain."""
        from attn_mt.langid import rank

        sources = self.source_languages()
        ranked = rank(text, sources) if len(sources) > 1 else []
        if not ranked:  # one source language, or none that py3langid knows: all alike
            ranked = [(lang, 1 / len(sources)) for lang in sources]
        return [{"confidence": round(100 * p, 1), "language": lang} for lang, p in ranked]
