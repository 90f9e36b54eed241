"""What the server does with the model, apart from HTTP: translate through the batcher, draw the
cross-attention of one sentence, describe the model. Everything here goes through the public
`Translator` (`attn_mt.load`), so a reply holds exactly what `attn-mt translate` writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.decode.request import Request
from attn_mt.errors import UserError
from attn_mt.serve.batcher import Batcher, Call, Job

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translation, Translator

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
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


class Disconnected(Exception):
    """The client went away before its translation was ready."""


@dataclass(frozen=True)
class Limits:
    """What one request may hold; past a limit it is refused (413) before any decoding."""

    max_lines: int = 64  # lines per request
    max_chars: int = 2000  # characters per line
    max_body_bytes: int = 1 << 20  # bytes of the request body
    max_beam: int = 32  # beam (and n-best) width


class Service:
    """The loaded translator behind one worker thread (`Batcher`), plus what /info reports."""

    def __init__(
        self,
        translator: Translator,
        models: list[Path],
        limits: Limits,
        max_batch_tokens: int,
        max_wait_ms: float,
    ):
        self.translator = translator
        self.models = models
        self.limits = limits
        self.max_batch_tokens = max_batch_tokens  # a batch's source tokens, as decode.batch_tokens
        self.batcher = Batcher(self._decode, max_wait_ms)
        self.directions = translator.config.data.directions()
        self.src_lang, self.tgt_lang = self.directions[0]  # of a bilingual model, its pair

    def _decode(
        self,
        lines: list[str],
        request: Request,
        constraints: list[list[str]] | None,
        prefixes: list[str | None] | None,
        first_line: int,
    ) -> list[list[Translation]]:
        """One library call (on the worker thread)."""
        request = replace(
            request, constraints=constraints, prefixes=prefixes, first_line=first_line
        )
        return self.translator.translate_nbest(lines, request)

    async def translate(
        self,
        lines: list[str],
        request: Request,
        constraints: list[list[str]] | None = None,
        prefixes: list[str | None] | None = None,
        disconnected: Any = None,
    ) -> list[list[Translation]]:
        """The n-best lists of `lines`, decoded as `request` asks (what the lines share;
        `constraints` and `prefixes` per line) in the worker's batches with other requests'.

        `disconnected`: an async function telling whether the client went away; then the
        job's undecoded lines are dropped and `Disconnected` is raised."""
        if not lines:
            return []
        request = self.translator.resolve(replace(request, batch_tokens=self.max_batch_tokens))
        # Source tokens of each line with its <eos>, what a batch's budget counts (the
        # translation warns of a line cut short).
        sizes = [
            len(ids) + 1 for ids in self.translator.encode(lines, request.tgt_lang, warn=False)
        ]
        job = Job(list(lines), request, constraints, prefixes, sizes)
        return await self._wait(job, self.batcher.submit(job), disconnected)

    async def call(self, function: Any) -> Any:
        """Run `function()` on the worker thread (it uses the model) and return its result."""
        call = Call(function)
        return await asyncio.wrap_future(self.batcher.submit(call))

    async def _wait(self, job: Job, future: Any, disconnected: Any) -> Any:
        """Await the job's future, cancelling the job if its client disconnects."""
        waiting = asyncio.wrap_future(future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
            if done:
                return waiting.result()
            if disconnected is not None and await disconnected():
                job.cancel()
                raise Disconnected

    def check_language(self, tgt_lang: str | None, option: str = "tgt_lang") -> None:
        """Refuse a target language the model does not translate into (a multilingual model
        takes any of its target languages, and needs one)."""
        if len(self.directions) > 1:
            try:
                self.translator.language_prefix(tgt_lang)
            except UserError as err:
                raise UserError(str(err).replace("--tgt-lang", option, 1)) from None
        elif tgt_lang is not None and tgt_lang != self.tgt_lang:
            raise UserError(
                f"{option} {tgt_lang!r}: this model translates {self.src_lang} -> "
                f"{self.tgt_lang} only"
            )

    def source_languages(self) -> list[str]:
        """The languages the model reads, in order of first use."""
        return list(dict.fromkeys(src for src, _ in self.directions))

    def attention(self, text: str, beam: int | None, tgt_lang: str | None = None) -> dict[str, Any]:
        """Translate `text` (on the worker thread) and return its head-mean cross-attention at
        decode.alignment_layer, as the alignment uses it: rows are the output pieces and the
        `</s>` that ended them, columns the source pieces and the source's `</s>`."""
        from attn_mt.model.vocab import EOS_ID

        translator = self.translator
        [best] = translator.translate_nbest([text], beam=beam, tgt_lang=tgt_lang)[0][:1]
        [ids] = translator.encode([text], tgt_lang, warn=False)  # as the search read it
        if not ids or not best.tokens:
            return {"translation": best.text, "source": [], "target": [], "weights": []}
        weights = translator.cross_attention([ids], [best.tokens])[0]  # (T+1, S+1)
        return {
            "translation": best.text,
            "source": translator.src_tokenizer.pieces([*ids, EOS_ID]),
            "target": translator.tgt_tokenizer.pieces([*best.tokens, EOS_ID]),
            "weights": [[round(w, 4) for w in row] for row in weights.tolist()],
        }

    def languages(self) -> list[dict[str, Any]]:
        """LibreTranslate's /languages: every language with the ones it translates into."""
        codes = dict.fromkeys(lang for direction in self.directions for lang in direction)
        return [
            {
                "code": code,
                "name": LANGUAGE_NAMES.get(code, code),
                "targets": [tgt for src, tgt in self.directions if src == code],
            }
            for code in codes
        ]

    def info(self) -> dict[str, Any]:
        """The model, its settings and the server's limits, for GET /info."""
        from attn_mt import __version__

        return {
            "version": __version__,
            "models": [str(p) for p in self.models],
            "source_language": self.src_lang,
            "target_language": self.tgt_lang,
            **(
                {"directions": ["-".join(d) for d in self.directions]}
                if len(self.directions) > 1
                else {}
            ),
            **self.translator.describe(),
            "limits": asdict(self.limits),
            "batching": {
                "max_batch_tokens": self.max_batch_tokens,
                "max_wait_ms": self.batcher.max_wait * 1000,
                "batches_decoded": self.batcher.batches,
            },
        }
