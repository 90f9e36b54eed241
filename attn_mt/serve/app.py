"""The HTTP API (FastAPI) over a `Service`: /v1/translate, LibreTranslate's /translate and
/languages, /v1/attention, /health, /info, the try-it page at /, and OpenAPI at /docs.

Every refusal is a JSON object `{"error": "..."}` with a 4xx status: a request past a limit is
413 (the error names the limit's option), a malformed or mistyped one 422, a wrong API key 401.
A 500 is a bug.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from attn_mt.decode.request import Request as DecodeRequest
from attn_mt.errors import UserError
from attn_mt.serve.page import PAGE
from attn_mt.serve.service import Disconnected, Service

log = logging.getLogger("attn_mt")


class Strict(BaseModel):
    """A request body: no unknown fields, no silent type conversions."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TranslateRequest(Strict):
    """POST /v1/translate."""

    text: list[str] = Field(description="The sentences to translate, one per entry.")
    beam: int | None = Field(None, ge=1, description="Beam size (default: the model's).")
    nbest: int = Field(1, ge=1, description="Return the N best of each line with scores.")
    constraints: list[list[str]] | None = Field(
        None, description="Per line: terms the output must hold."
    )
    prefix: list[str | None] | None = Field(
        None, description="Per line: the text the output must start with (null: none)."
    )
    avoid: list[str] = Field([], description="Words or phrases no output may hold.")
    alignment: bool = Field(False, description="Add Pharaoh word pairs [source, target].")
    tgt_lang: str | None = Field(
        None, description="The target language: one of the model's (a multilingual model needs it)."
    )

    def settings(self) -> DecodeRequest:
        """What the lines share, as the library's Request (terms and prefixes are per line)."""
        return DecodeRequest(
            beam=self.beam,
            nbest=self.nbest,
            avoid=tuple(self.avoid),
            alignment=self.alignment,
            tgt_lang=self.tgt_lang,
        )


class AttentionRequest(Strict):
    """POST /v1/attention."""

    text: str
    beam: int | None = Field(None, ge=1)
    tgt_lang: str | None = Field(None, description="The target language (as /v1/translate's).")


class LibreRequest(Strict):
    """POST /translate, as LibreTranslate defines it."""

    q: str | list[str]
    source: str = "auto"
    target: str
    format: str = "text"
    api_key: str | None = None
    alternatives: int = Field(0, ge=0)


def create_app(service: Service, api_key: str | None = None) -> FastAPI:
    """The FastAPI app over `service`; with `api_key`, every route but /health needs
    `Authorization: Bearer KEY`."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        service.batcher.start()
        yield
        service.batcher.stop()  # uvicorn calls this once in-flight requests have finished

    app = FastAPI(title="attn-mt", lifespan=lifespan, dependencies=[Depends(_auth(api_key))])
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=service.limits.max_body_bytes)
    _add_routes(app, service)
    return app


def _auth(api_key: str | None):
    """The dependency that checks the bearer key (or LibreTranslate's `api_key` field)."""

    async def check(request: Request) -> None:
        if api_key is None or request.url.path == "/health":
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), api_key):
            return
        if request.url.path == "/translate" and await _body_key(request) == api_key:
            return
        raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY'")

    return check


async def _body_key(request: Request) -> str | None:
    """LibreTranslate's `api_key` field of a JSON body, if any."""
    try:
        body = await request.json()
    except ValueError:
        return None
    key = body.get("api_key") if isinstance(body, dict) else None
    return key if isinstance(key, str) else None


def _add_routes(app: FastAPI, service: Service) -> None:
    """Every route of the API."""

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Liveness: answers while a batch is decoding."""
        return {"status": "ok"}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        """The model, its languages, parameter count, decode settings, limits and version."""
        return service.info()

    @app.get("/languages")
    async def languages() -> list[dict[str, Any]]:
        """LibreTranslate: `[{"code", "name", "targets"}]`."""
        return service.languages()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> str:
        return PAGE

    @app.post("/v1/translate")
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate `text`; `{"translations": [...]}` as `attn-mt translate` writes them."""
        service.check_language(body.tgt_lang)
        _check_lines(service, body.text)
        _check_width(service, max(body.beam or 0, body.nbest))
        for name, given in (("constraints", body.constraints), ("prefix", body.prefix)):
            if given is not None and len(given) != len(body.text):
                lines = len(body.text)
                raise HTTPException(422, f"{name}: give one entry per line of text ({lines})")
        found = await service.translate(
            body.text, body.settings(), body.constraints, body.prefix, request.is_disconnected
        )
        return translations_json(found, body.nbest, body.alignment)

    @app.post("/v1/attention")
    async def attention(body: AttentionRequest) -> dict[str, Any]:
        """The translation of `text` and its cross-attention (output x source pieces)."""
        _check_lines(service, [body.text])
        _check_width(service, body.beam or 0)
        service.check_language(body.tgt_lang)
        return await service.call(lambda: service.attention(body.text, body.beam, body.tgt_lang))

    @app.post("/translate")
    async def libre_translate(body: LibreRequest, request: Request) -> dict[str, Any]:
        """LibreTranslate: `q` (a str or a list), `source`, `target` -> `translatedText`."""
        if body.source not in ("auto", *service.source_languages()):
            reads = ", ".join(service.source_languages())
            raise HTTPException(400, f"source {body.source!r}: this model reads {reads}")
        service.check_language(body.target, "target")
        if body.format != "text":
            raise HTTPException(400, f"format {body.format!r}: only 'text' is supported")
        lines = [body.q] if isinstance(body.q, str) else body.q
        _check_lines(service, lines)
        tgt_lang = body.target if len(service.directions) > 1 else None
        asked = DecodeRequest(tgt_lang=tgt_lang)
        found = await service.translate(lines, asked, disconnected=request.is_disconnected)
        texts = [entries[0].text for entries in found]
        return {"translatedText": texts[0] if isinstance(body.q, str) else texts}


def _check_lines(service: Service, lines: list[str]) -> None:
    """413 for a request with more lines, or a line with more characters, than allowed."""
    limits = service.limits
    if len(lines) > limits.max_lines:
        raise HTTPException(413, f"{len(lines)} lines: more than --max-lines {limits.max_lines}")
    for number, line in enumerate(lines, start=1):
        if len(line) > limits.max_chars:
            raise HTTPException(
                413,
                f"line {number}: {len(line)} characters, more than --max-chars {limits.max_chars}",
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
    """Every refusal as `{"error": ...}`: user errors of the library 422, validation 422."""

    @app.exception_handler(UserError)
    async def user_error(_request: Request, err: UserError) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=422)

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


def _problem(error: dict[str, Any]) -> str:
    """One validation error as `where: what` (`body.beam: Input should be ...`)."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}"


class BodyLimit:
    """ASGI middleware: a request body past `limit` bytes is refused with 413 (by its
    Content-Length at once, or as it streams in)."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.limit:
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        error = f"request body over --max-body-bytes {self.limit}"
        response = JSONResponse({"error": error}, status_code=413)
        await response({"type": "http"}, _no_body, send)


async def _no_body() -> dict[str, Any]:
    """The ASGI `receive` of a response that reads nothing."""
    return {"type": "http.disconnect"}


class _TooLarge(Exception):
    """A streamed body passed the limit."""
