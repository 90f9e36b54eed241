"""What the server does with its models, apart from HTTP: translate paragraphs and HTML pages
through the batcher (split into sentences, joined back), draw the cross-attention of one
sentence, describe the models. Everything goes through the public `Translator` and the
library's own splitting (`documents.sentences`, `documents.paragraphs`, `documents.markup`),
so a reply holds exactly what `attn-mt translate` writes, but that a paragraph keeps its own
leading and trailing whitespace (which the command line, like the Translator, strips from a line).

A request's text is parsed, split and joined on a thread (`asyncio.to_thread`), never on the
event loop: a large page takes seconds, during which /health and other requests are answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from attn_mt.cpuenv import ThreadSizer
from attn_mt.decode.request import Request
from attn_mt.documents.markup import Page
from attn_mt.documents.paragraphs import ParagraphTranslation, Split, split_lines
from attn_mt.errors import UserError
from attn_mt.serve.batcher import Batcher, Call, Job
from attn_mt.serve.routing import Route, Router

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translation

DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


class Disconnected(Exception):
    """The client went away before its translation was ready."""


class PastLimit(UserError):
    """A request past one of the server's `Limits` (413)."""


@dataclass(frozen=True)
class Limits:
    """What one request may hold; past a limit it is refused (413) before any decoding. A
    sentence needs no limit of its own: one longer than the model reads is cut in pieces."""

    max_lines: int = 64  # entries (paragraphs or pages) per request
    # Characters per request: its text (an HTML page's: the text of its blocks), terms,
    # prefixes, avoided words and glossary together.
    max_chars: int = 100_000
    max_body_bytes: int = 4 << 20  # bytes of the request body
    max_beam: int = 32  # beam (and n-best) width
    max_terms: int = 8  # terms per line (a glossary's that a sentence holds counted in)
    max_avoid: int = 64  # avoided words per request


@dataclass
class Asked:
    """Where a request goes: the route, the translator's target language, the source."""

    route: Route
    tgt_lang: str | None
    src_lang: str


@dataclass
class Documents:
    """A request's entries as they are translated: plain paragraphs as given, or HTML pages as
    the text of their blocks (`pages`, parsed)."""

    entries: list[str]
    pages: list[Page] | None = None  # None: plain text

    @property
    def texts(self) -> list[str]:
        """The paragraphs translated: each entry, or each block of each page, in order."""
        if self.pages is None:
            return self.entries
        return [text for page in self.pages for text in page.texts]

    def text_of(self, entry: int) -> str:
        """What entry `entry` says, its markup left out: the text its language is told by."""
        return self.entries[entry] if self.pages is None else "\n".join(self.pages[entry].texts)

    def subset(self, rows: Sequence[int]) -> Documents:
        """The entries `rows`, in that order."""
        pages = None if self.pages is None else [self.pages[r] for r in rows]
        return Documents([self.entries[r] for r in rows], pages)

    def results(
        self, found: list[list[ParagraphTranslation]], nbest: int
    ) -> list[list[ParagraphTranslation]]:
        """Each entry's n-best from the n-best of `texts` (`found`): a page rendered with one
        entry of each of its blocks."""
        if self.pages is None:
            return found
        results, at = [], 0
        for page in self.pages:
            blocks = found[at : at + len(page.blocks)]
            at += len(blocks)
            results.append([_page(page, [b[k] for b in blocks]) for k in range(nbest)])
        return results


class Service:
    """The loaded models behind one worker thread (`Batcher`), plus what /info reports."""

    def __init__(
        self,
        routes: list[Route],
        limits: Limits,
        max_batch_tokens: int,
        max_wait_ms: float,
        batcher: Batcher | None = None,
    ):
        """`batcher`: the worker the routes' models were loaded on (`new_worker`; None: a new
        one)."""
        self.router = Router(routes)
        self.limits = limits
        self.max_batch_tokens = max_batch_tokens  # a batch's source tokens, as decode.batch_tokens
        self.batcher = batcher or new_worker(max_wait_ms)

    def find(self, src: str | None, tgt: str | None, names=("src_lang", "tgt_lang")) -> Asked:
        """Where `src` -> `tgt` goes (see `Router.find`)."""
        return Asked(*self.router.find(src, tgt, names))

    def check_entries(self, entries: Sequence[str]) -> None:
        """PastLimit for more entries than `max_lines`."""
        if len(entries) > self.limits.max_lines:
            raise PastLimit(f"{len(entries)} lines: more than --max-lines {self.limits.max_lines}")

    def check_chars(self, texts: Sequence[str], request: Request | None = None) -> None:
        """PastLimit for a request whose `texts`, with the terms, prefixes, avoided words and
        glossary of its `request`, hold more characters than `max_chars`."""
        steering = 0 if request is None else _steering_chars(request)
        chars = sum(map(len, texts)) + steering
        if chars > self.limits.max_chars:
            what = "with its terms, prefixes, avoided words and glossary" if steering else "of text"
            raise PastLimit(
                f"{chars} characters {what}: more than --max-chars {self.limits.max_chars}"
            )

    def check_text(self, entries: Sequence[str]) -> None:
        """`check_entries` and `check_chars` of plain text."""
        self.check_entries(entries)
        self.check_chars(entries)

    async def documents(self, entries: list[str], html: bool = False) -> Documents:
        """`entries` as they are translated: HTML pages (`html`) parsed on a thread."""
        if not html:
            return Documents(entries)
        return Documents(entries, await asyncio.to_thread(lambda: [Page(e) for e in entries]))

    async def translate(
        self,
        documents: Documents,
        request: Request,
        disconnected: Any = None,
        asked: Asked | None = None,
        sentences: bool = True,
    ) -> list[list[ParagraphTranslation]]:
        """The n-best lists of the entries (paragraphs: split into sentences unless `sentences`
        is False, joined with their own spacing and line breaks; HTML pages: their blocks
        translated so, the markup kept, inline tags placed by the word alignment), decoded as
        `request` asks (terms and prefixes per entry, a glossary's terms per sentence) in the
        worker's batches with other requests' sentences. `asked`: where they go (None: where
        `request.tgt_lang` leads).

        `disconnected`: an async function telling whether the client went away; then the
        job's undecoded lines are dropped and `Disconnected` is raised."""
        if documents.pages is not None:
            request = replace(request, alignment=True)  # inline tags follow the words
        asked = asked or self.find(None, request.tgt_lang)
        translator = asked.route.translator
        request = replace(request, tgt_lang=asked.tgt_lang, batch_tokens=self.max_batch_tokens)
        request = translator.resolve(request)
        split, job = await asyncio.to_thread(self._job, documents.texts, request, asked, sentences)
        found: list[list[Translation]] = []
        if job is not None:
            try:
                found = await self._wait(job, self.batcher.submit(job), disconnected)
            except UserError as err:
                raise split.user_error(err, 1) from None

        def joined() -> list[list[ParagraphTranslation]]:
            entries = split.join(found, request.nbest, request.alignment, line_breaks=True)
            return documents.results(entries, request.nbest)

        return await asyncio.to_thread(joined)

    def _job(
        self, texts: list[str], request: Request, asked: Asked, sentences: bool
    ) -> tuple[Split, Job | None]:
        """`texts` split into the segments decoded, and the job that decodes them (None: no
        segment), each segment with its entry's terms and the glossary's it holds."""
        translator = asked.route.translator
        split = split_lines(translator, texts, request, asked.src_lang, sentences)
        segments = split.texts
        if not segments:
            return split, None
        terms: Sequence[Sequence[str]] | None = split.per_segment(request.constraints)
        if request.glossary is not None:
            terms = request.glossary.constraints(segments, terms)
            for number, found in enumerate(terms, start=1):
                if len(found) > self.limits.max_terms:
                    where = split.user_error(UserError(f"line {number}"), 1)
                    raise PastLimit(
                        f"{where}: {len(found)} terms with the glossary's, more than "
                        f"--max-terms {self.limits.max_terms}"
                    )
        # Source tokens of each sentence with its <eos>, what a batch's budget counts.
        encoded = translator.encode(segments, request.tgt_lang, warn=False)
        job = Job(
            segments,
            replace(request, constraints=None, prefixes=None, glossary=None),  # all share it
            terms,
            split.per_segment(request.prefixes),
            [len(ids) + 1 for ids in encoded],
            translator,
        )
        return split, job

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
        if translator.text is not None:  # recased, its spans out: what the model read
            text = translator.text.read([text], tgt_lang)[0].text
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


def _steering_chars(request: Request) -> int:
    """The characters of a request's terms, prefixes, avoided words and glossary."""
    terms = [term for line in request.constraints or () for term in line]
    texts = [*terms, *(prefix or "" for prefix in request.prefixes or ()), *request.avoid]
    glossary = request.glossary.entries if request.glossary is not None else ()
    return sum(map(len, texts)) + sum(len(s) + len(t) for s, t in glossary)


def new_worker(max_wait_ms: float) -> Batcher:
    """The worker thread that decodes the service's batches, not started: load the models on
    it (`Batcher.on_worker`), so that it is the only thread that computes. Before each batch it
    sizes torch's threads to the cores other processes leave free (`cpuenv.ThreadSizer`)."""
    import torch

    sizer = ThreadSizer(torch.get_num_threads, torch.set_num_threads)

    def decode(translator: Any, lines: list[str], request: Request) -> list[list[Translation]]:
        sizer.adjust()
        return translator.translate_nbest(lines, request)

    return Batcher(decode, max_wait_ms)


def _page(document: Page, blocks: list[ParagraphTranslation]) -> ParagraphTranslation:
    """One entry of a page: the page rendered with one entry of each block, their scores'
    mean and their sentences."""
    sentences = [s for block in blocks for s in block.sentences]
    scores = [block.score for block in blocks]
    score = sum(scores) / len(scores) if scores else 0.0
    return ParagraphTranslation(document.render(blocks), score, [], None, sentences)
