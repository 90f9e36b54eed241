"""The HTTP API (FastAPI) over a `Service`: /v1/translate, LibreTranslate's /translate,
/detect and /languages (`serve.libre`), /v1/attention, /health, /info, the try-it page at /
(`page.html`, beside this module), and OpenAPI at /docs.

Every refusal is a JSON object `{"error": "..."}` with a 4xx status: a request past a limit is
413 (the error names the limit's option), a malformed or mistyped one 422, a wrong API key 401
(`serve.guard`), a pair the server does not translate, or `auto` text in a language no model
translates from, 422 (400 on LibreTranslate's routes); 503 while the decode worker is down.
A 500 is a bug.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from importlib import resources
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from attn_mt.decode.glossary import Glossary
from attn_mt.decode.request import Request as DecodeRequest
from attn_mt.errors import UserError
from attn_mt.serve.batcher import WorkerDown
from attn_mt.serve.guard import BodyGuard, Text, key_checker
from attn_mt.serve.libre import add_libre_routes
from attn_mt.serve.service import Disconnected, Documents, PastLimit, Service

log = logging.getLogger("attn_mt")
PAGE = resources.files("attn_mt.serve").joinpath("page.html").read_text(encoding="utf-8")


class Strict(BaseModel):
    """A request body: no unknown fields, no silent type conversions."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TranslateRequest(Strict):
    """POST /v1/translate."""

    text: list[Text] = Field(description="Paragraphs (or HTML pages) to translate, one an entry.")
    beam: int | None = Field(None, ge=1, description="Beam size (default: the model's).")
    nbest: int = Field(1, ge=1, description="Return the N best of each entry with scores.")
    constraints: list[list[Text]] | None = Field(
        None, description="Per entry: terms the output must hold (the entry is not split)."
    )
    prefix: list[Text | None] | None = Field(
        None, description="Per entry: the text the output must start with (null: none)."
    )
    avoid: list[Text] = Field([], description="Words or phrases no output may hold.")
    glossary: dict[Text, Text] | None = Field(
        None,
        description="Source term -> target term: a sentence holding a source term (whole "
        "words, any case) gets its target term as a constraint.",
    )
    alignment: bool = Field(False, description="Add Pharaoh word pairs [source, target].")
    src_lang: Text | None = Field(
        None, description="The source language, or 'auto' (needed where models differ)."
    )
    tgt_lang: Text | None = Field(
        None, description="The target language (needed where several fit the source)."
    )
    format: Literal["text", "html"] = Field("text", description="'html': keep the markup.")
    split_sentences: bool = Field(True, description="Translate each sentence on its own.")
    scores: bool = Field(
        False, description="Add each sentence's model score (mean log-probability per token)."
    )

    def settings(self) -> DecodeRequest:
        """What the lines share, as the library's Request (terms and prefixes per line)."""
        return DecodeRequest(
            beam=self.beam,
            nbest=self.nbest,
            avoid=tuple(self.avoid),
            alignment=self.alignment,
            constraints=self.constraints,
            prefixes=self.prefix,
            glossary=None if self.glossary is None else Glossary.of(self.glossary),
        )


class AttentionRequest(Strict):
    """POST /v1/attention."""

    text: Text = Field(description="One sentence.")
    beam: int | None = Field(None, ge=1)
    src_lang: Text | None = Field(None, description="As /v1/translate's.")
    tgt_lang: Text | None = Field(None, description="As /v1/translate's.")


def create_app(service: Service, api_key: str | None = None) -> FastAPI:
    """The FastAPI app over `service`; with `api_key`, every route but /health needs
    `Authorization: Bearer KEY`. `app.state.stopping`: set it when the server starts to stop."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        service.batcher.start()
        yield
        service.batcher.stop()  # uvicorn calls this once in-flight requests have finished

    app = FastAPI(
        title="attn-mt",
        lifespan=lifespan,
        dependencies=[Depends(key_checker(api_key))],
        docs_url=None,  # /docs and /openapi.json are routes below, behind the key
        openapi_url=None,
    )
    app.state.stopping = threading.Event()
    _add_error_handlers(app)
    app.add_middleware(BodyGuard, limit=service.limits.max_body_bytes, stopping=app.state.stopping)
    _add_routes(app, service)
    add_libre_routes(app, service, key_required=api_key is not None)
    return app


def _add_routes(app: FastAPI, service: Service) -> None:
    """The routes of attn-mt's own API, the page and the docs."""

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness: answers while a batch is decoding; 503 if the decode worker is down."""
        if service.batcher.alive():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "error", "error": "the decode worker is down"}, 503)

    @app.get("/info")
    async def info() -> dict[str, Any]:
        """The models, their languages and settings, the limits and the version."""
        return service.info()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> str:
        return PAGE

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="attn-mt API")

    @app.post("/v1/translate")
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate `text`; `{"translations": [...]}` as `attn-mt translate --split-sentences`
        writes them."""
        check_translate(service, body)
        settings = body.settings()
        documents = await service.documents(body.text, body.format == "html")
        service.check_chars(documents.texts, settings)
        detected, asked = _route(service, body.src_lang, body.tgt_lang, documents)
        found = await service.translate(
            documents, settings, request.is_disconnected, asked, body.split_sentences
        )
        reply = translations_json(found, body.nbest, body.alignment)
        if body.scores:
            reply["sentences"] = [
                [{"source": s, "text": t.text, "score": t.score} for s, t in entries[0].sentences]
                for entries in found
            ]
        if detected is not None:
            reply["detected_language"] = detected
        return reply

    @app.post("/v1/attention")
    async def attention(body: AttentionRequest) -> dict[str, Any]:
        """The translation of one sentence and its cross-attention (output x source pieces)."""
        service.check_text([body.text])
        _check_width(service, body.beam or 0)
        _, asked = _route(service, body.src_lang, body.tgt_lang, Documents([body.text]))
        return await service.call(lambda: service.attention(body.text, body.beam, asked))


def _route(
    service: Service, src_lang: str | None, tgt_lang: str | None, documents: Documents
) -> tuple[dict[str, Any] | None, Any]:
    """The detected source language (for 'auto', identified from all the text) and where the
    request goes."""
    detected = None
    if src_lang == "auto":
        detected = service.router.source_of("\n".join(documents.texts))
        src_lang = detected["language"]
    return detected, service.find(src_lang, tgt_lang)


def check_translate(service: Service, body: TranslateRequest) -> None:
    """413 for a /v1/translate request past a limit, 422 for options that exclude each other;
    its characters are counted once its pages are read (`Service.check_chars`)."""
    service.check_entries(body.text)
    _check_width(service, max(body.beam or 0, body.nbest))
    limits = service.limits
    for name, given in (("constraints", body.constraints), ("prefix", body.prefix)):
        if given is not None and len(given) != len(body.text):
            raise HTTPException(422, f"{name}: give one entry per line of text ({len(body.text)})")
    if body.format == "html" and (body.alignment or body.constraints or body.prefix):
        raise HTTPException(422, "format html: it takes no alignment, constraints or prefix")
    for number, terms in enumerate(body.constraints or [], start=1):
        if len(terms) > limits.max_terms:
            raise HTTPException(
                413, f"line {number}: {len(terms)} terms, more than --max-terms {limits.max_terms}"
            )
    if len(body.avoid) > limits.max_avoid:
        raise HTTPException(
            413, f"avoid: {len(body.avoid)} words, more than --max-avoid {limits.max_avoid}"
        )


def _check_width(service: Service, width: int) -> None:
    """413 for a beam or n-best wider than allowed."""
    if width > service.limits.max_beam:
        raise HTTPException(
            413, f"beam/nbest {width}: more than --max-beam {service.limits.max_beam}"
        )


def translations_json(found: list[list[Any]], nbest: int, alignment: bool) -> dict[str, Any]:
    """`{"translations": [text, ...]}`; with nbest > 1, a list of `{"text", "score"}` per line;
    with alignment, each line's `[source, target]` word pairs (per entry with nbest > 1)."""
    if nbest == 1:
        reply: dict[str, Any] = {"translations": [entries[0].text for entries in found]}
        if alignment:
            reply["alignments"] = [_pairs(entries[0]) for entries in found]
        return reply
    return {
        "translations": [
            [
                {
                    "text": e.text,
                    "score": e.score,
                    **({"alignment": _pairs(e)} if alignment else {}),
                }
                for e in entries
            ]
            for entries in found
        ]
    }


def _pairs(entry: Any) -> list[list[int]]:
    return [[i, j] for i, j in entry.alignment or []]


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal as `{"error": ...}`: user errors of the library 422 (past a limit 413),
    validation 422."""

    @app.exception_handler(UserError)
    async def user_error(_request: Request, err: UserError) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=422)

    @app.exception_handler(PastLimit)
    async def past_limit(_request: Request, err: PastLimit) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=413)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, err: HTTPException) -> JSONResponse:
        return JSONResponse({"error": err.detail}, status_code=err.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        problems = [_problem(e) for e in err.errors()]
        return JSONResponse({"error": "; ".join(problems)}, status_code=422)

    @app.exception_handler(Disconnected)
    async def gone(_request: Request, _err: Disconnected) -> JSONResponse:
        return JSONResponse({"error": "client disconnected"}, status_code=499)

    @app.exception_handler(WorkerDown)
    async def down(_request: Request, err: WorkerDown) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=503)


def _problem(error: dict[str, Any]) -> str:
    """One validation error as `where: what` (`body.beam: Input should be ...`)."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}"
