"""What the server does with its models, apart from HTTP: translate paragraphs and HTML pages
through the batcher (split into sentences, joined back), draw the cross-attention of one
sentence, describe the models. Everything goes through the public `Translator` and the
library's own splitting (`documents.sentences`, `documents.paragraphs`, `documents.markup`),
so a reply holds exactly what `attn-mt translate --split-sentences` writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from attn_mt.decode.request import Request
from attn_mt.documents.markup import Page
from attn_mt.documents.paragraphs import ParagraphTranslation, split_lines
from attn_mt.errors import UserError
from attn_mt.serve.batcher import Batcher, Call, Job
from attn_mt.serve.routing import Route, Router

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translation

DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


class Disconnected(Exception):
    """The client went away before its translation was ready."""


@dataclass(frozen=True)
class Limits:
    """What one request may hold; past a limit it is refused (413) before any decoding."""

    max_lines: int = 64  # lines per request
    max_chars: int = 2000  # characters per line (its terms and prefix counted in)
    max_body_bytes: int = 1 << 20  # bytes of the request body
    max_beam: int = 32  # beam (and n-best) width
    max_terms: int = 8  # terms per line
    max_avoid: int = 64  # avoided words per request


@dataclass
class Asked:
    """Where a request goes: the route, the translator's target language, the source."""

    route: Route
    tgt_lang: str | None
    src_lang: str


class Service:
    """The loaded models behind one worker thread (`Batcher`), plus what /info reports."""

    def __init__(
        self, routes: list[Route], limits: Limits, max_batch_tokens: int, max_wait_ms: float
    ):
        self.router = Router(routes)
        self.limits = limits
        self.max_batch_tokens = max_batch_tokens  # a batch's source tokens, as decode.batch_tokens
        self.batcher = Batcher(_decode, max_wait_ms)

    def find(self, src: str | None, tgt: str | None, names=("src_lang", "tgt_lang")) -> Asked:
        """Where `src` -> `tgt` goes (see `Router.find`)."""
        return Asked(*self.router.find(src, tgt, names))

    async def translate(
        self,
        lines: list[str],
        request: Request,
        disconnected: Any = None,
        asked: Asked | None = None,
        sentences: bool = True,
    ) -> list[list[ParagraphTranslation]]:
        """The n-best lists of `lines` (paragraphs: split into sentences unless `sentences` is
        False, joined with their own spacing), decoded as `request` asks (with terms and
        prefixes per line) in the worker's batches with other requests' sentences. `asked`:
        where they go (None: where `request.tgt_lang` leads).

        `disconnected`: an async function telling whether the client went away; then the
        job's undecoded lines are dropped and `Disconnected` is raised."""
        asked = asked or self.find(None, request.tgt_lang)
        translator = asked.route.translator
        request = replace(request, tgt_lang=asked.tgt_lang, batch_tokens=self.max_batch_tokens)
        request = translator.resolve(request)
        split = split_lines(translator, lines, request, asked.src_lang, sentences)
        texts = split.texts
        if not texts:
            return split.join([], request.nbest, request.alignment, line_breaks=True)
        # Source tokens of each sentence with its <eos>, what a batch's budget counts.
        encoded = translator.encode(texts, request.tgt_lang, warn=False)
        job = Job(
            texts,
            replace(request, constraints=None, prefixes=None),  # what the lines share
            split.per_segment(request.constraints),
            split.per_segment(request.prefixes),
            [len(ids) + 1 for ids in encoded],
            translator,
        )
        try:
            found = await self._wait(job, self.batcher.submit(job), disconnected)
        except UserError as err:
            raise split.user_error(err, 1) from None
        return split.join(found, request.nbest, request.alignment, line_breaks=True)

    async def translate_html(
        self, pages: list[str], request: Request, disconnected: Any = None, asked=None
    ) -> list[list[ParagraphTranslation]]:
        """The n-best of each HTML page (`documents.markup`): its blocks' text translated as
        paragraphs, the markup kept, inline tags placed by the word alignment."""
        documents = [Page(page) for page in pages]
        texts = [text for document in documents for text in document.texts]
        aligned = replace(request, alignment=True)
        found = await self.translate(texts, aligned, disconnected, asked)
        results, at = [], 0
        for document in documents:
            blocks = found[at : at + len(document.blocks)]
            at += len(blocks)
            results.append([_page(document, [b[k] for b in blocks]) for k in range(request.nbest)])
        return results

    async def call(self, function: Any) -> Any:
        """Run `function()` on the worker thread (it uses a model) and return its result."""
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

    def attention(self, text: str, beam: int | None, asked: Asked | None = None) -> dict[str, Any]:
        """Translate the sentence `text` (on the worker thread) and return its head-mean
        cross-attention at decode.alignment_layer, as the alignment uses it: rows are the output
        pieces and the `</s>` that ended them, columns the source pieces and the source's
        `</s>`."""
        from attn_mt.model.vocab import EOS_ID

        asked = asked or self.find(None, None)
        translator, tgt_lang = asked.route.translator, asked.tgt_lang
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

    def info(self) -> dict[str, Any]:
        """The models, their settings and the server's limits, for GET /info."""
        from importlib.metadata import version

        from attn_mt import __version__

        return {
            "version": __version__,
            "models": [route.describe() for route in self.router.routes],
            "sentence_splitter": f"sentencex {version('sentencex')}",
            "limits": asdict(self.limits),
            "batching": {
                "max_batch_tokens": self.max_batch_tokens,
                "max_wait_ms": self.batcher.max_wait * 1000,
                "batches_decoded": self.batcher.batches,
            },
        }


def _decode(translator: Any, lines: list[str], request: Request) -> list[list[Translation]]:
    """One library call (on the worker thread)."""
    return translator.translate_nbest(lines, request)


def _page(document: Page, blocks: list[ParagraphTranslation]) -> ParagraphTranslation:
    """One entry of a page: the page rendered with one entry of each block, their scores'
    mean and their sentences."""
    sentences = [s for block in blocks for s in block.sentences]
    scores = [block.score for block in blocks]
    score = sum(scores) / len(scores) if scores else 0.0
    return ParagraphTranslation(document.render(blocks), score, [], None, sentences)
