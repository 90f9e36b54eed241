"""LibreTranslate's API as its clients call it: `POST /translate` (`q`, `source` or `auto`,
`target`, `format` text or html, `alternatives`, `api_key`, and `glossary`, which LibreTranslate
has been asked for), `POST /detect`, `GET /languages` and the web front end's
`GET /frontend/settings`, each body JSON or a form (urlencoded, read as UTF-8, or multipart;
`glossary` in JSON only). A pair the server does not translate, or `auto` text in a language no
model here translates from, is refused with 400 as LibreTranslate refuses it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from attn_mt.decode.glossary import Glossary
from attn_mt.decode.request import Request as DecodeRequest
from attn_mt.errors import UserError
from attn_mt.serve.guard import FORMS, Text, read_body
from attn_mt.serve.routing import language_name
from attn_mt.serve.service import Asked, Documents, Service

FRONTEND_TIMEOUT_MS = 500  # the front end's pause after typing before it translates


class LibreRequest(BaseModel):
    """POST /translate, as LibreTranslate defines it."""

    model_config = ConfigDict(extra="forbid")

    q: Text | list[Text] = Field(description="The text, or a list of texts, to translate.")
    source: Text = Field("auto", description="Its language, or 'auto' to detect it.")
    target: Text = Field(description="The language to translate into.")
    format: Literal["text", "html"] = Field("text", description="'html': keep the markup.")
    api_key: Text | None = None
    alternatives: int = Field(0, ge=0, description="Other translations to add, best first.")
    glossary: dict[Text, Text] | None = Field(
        None,
        description="Source term -> target term: a sentence holding a source term (whole "
        "words, any case) gets its target term as a constraint (JSON bodies).",
    )


class DetectRequest(BaseModel):
    """POST /detect."""

    model_config = ConfigDict(extra="forbid")

    q: Text
    api_key: Text | None = None


async def parsed(request: Request, model: type[BaseModel]) -> Any:
    """The body as `model`: JSON strictly typed, a form's strings converted (as a form has
    no other type); 422 with each problem otherwise."""
    try:
        body = await read_body(request)
    except ValueError as err:
        raise HTTPException(422, f"body: not a JSON object or a form ({err})") from None
    is_form = request.headers.get("content-type", "").split(";")[0].strip().lower() in FORMS
    try:
        return model.model_validate(body, strict=not is_form)
    except ValidationError as err:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()
        ]
        raise HTTPException(422, "; ".join(problems)) from None


def add_libre_routes(app: FastAPI, service: Service, key_required: bool) -> None:
    """LibreTranslate's routes; `key_required`: whether the server asks for an API key."""
    schema = {"requestBody": _body_schema(LibreRequest)}

    @app.get("/languages")
    async def languages() -> list[dict[str, Any]]:
        """LibreTranslate: `[{"code", "name", "targets"}]`, every pair served."""
        return service.router.languages()

    @app.get("/frontend/settings")
    async def frontend_settings() -> dict[str, Any]:
        """LibreTranslate's web front end: its settings (`_frontend_settings`)."""
        return _frontend_settings(service, key_required)

    @app.post("/detect", openapi_extra={"requestBody": _body_schema(DetectRequest)})
    async def detect(request: Request) -> list[dict[str, Any]]:
        """LibreTranslate: the languages `q` is likeliest in, among all py3langid knows."""
        body = await parsed(request, DetectRequest)
        service.check_text([body.q])
        return service.router.detect(body.q)

    @app.post("/translate", openapi_extra=schema)
    async def translate(request: Request) -> dict[str, Any]:
        """LibreTranslate: `q` (a str or a list), `source`, `target` -> `translatedText`."""
        return await _libre_translate(service, request)


def _frontend_settings(service: Service, key_required: bool) -> dict[str, Any]:
    """What LibreTranslate's web front end asks for: the character limit, whether a key is
    needed, the pair it starts with (the first served); no suggestions, no files."""
    source, target = service.router.pairs[0]
    return {
        "charLimit": service.limits.max_chars,
        "frontendTimeout": FRONTEND_TIMEOUT_MS,
        "apiKeys": False,  # no database of keys: one key, from --api-key-file
        "keyRequired": key_required,
        "suggestions": False,
        "filesTranslation": False,
        "supportedFilesFormat": [],
        "language": {
            "source": {"code": source, "name": language_name(source)},
            "target": {"code": target, "name": language_name(target)},
        },
    }


async def _libre_translate(service: Service, request: Request) -> dict[str, Any]:
    """One LibreTranslate `/translate` request answered: its entries checked, parsed as
    documents, their source languages detected where `source` is `auto`, translated; a single
    `q` gets single values back, a list gets lists."""
    body = await parsed(request, LibreRequest)
    entries = [body.q] if isinstance(body.q, str) else body.q
    service.check_entries(entries)
    widest = service.limits.max_beam
    if body.alternatives + 1 > widest:
        raise HTTPException(
            413, f"alternatives {body.alternatives}: more than --max-beam {widest} - 1"
        )
    glossary = None if body.glossary is None else Glossary.of(body.glossary)
    documents = await service.documents(entries, body.format == "html")
    settings = DecodeRequest(nbest=body.alternatives + 1, glossary=glossary)
    service.check_chars(documents.texts, settings)
    detected = None
    if body.source == "auto":
        texts = [documents.text_of(row) for row in range(len(entries))]
        try:
            detected = [service.router.source_of(text) for text in texts]
        except UserError as err:
            raise HTTPException(400, str(err)) from None
    sources = [d["language"] for d in detected] if detected else [body.source] * len(entries)
    found = await _translate(
        service, documents, sources, body.target, settings, request.is_disconnected
    )
    reply: dict[str, Any] = {"translatedText": [nbest[0].text for nbest in found]}
    if body.alternatives:
        reply["alternatives"] = [[e.text for e in nbest[1:]] for nbest in found]
    if detected is not None:
        reply["detectedLanguage"] = detected
    if isinstance(body.q, str):
        reply = {key: value[0] for key, value in reply.items()}
    return reply


async def _translate(
    service: Service,
    documents: Documents,
    sources: list[str],
    target: str,
    request: DecodeRequest,
    disconnected: Any,
) -> list[list[Any]]:
    """The n-best of each entry, each group of one source language on its own route."""
    groups: dict[str, list[int]] = {}
    for row, source in enumerate(sources):
        groups.setdefault(source, []).append(row)
    asked: dict[str, Asked] = {}
    for source in groups:
        try:
            asked[source] = service.find(source, target, ("source", "target"))
        except UserError as err:
            raise HTTPException(400, str(err)) from None
    found = await asyncio.gather(
        *(
            service.translate(documents.subset(rows), request, disconnected, asked[source])
            for source, rows in groups.items()
        )
    )
    results: list[list[Any]] = [[] for _ in sources]
    for rows, entries in zip(groups.values(), found, strict=True):
        for row, line_entries in zip(rows, entries, strict=True):
            results[row] = line_entries
    return results


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads JSON or a form of `model`."""
    schema = model.model_json_schema()
    content = {"schema": schema}
    return {
        "required": True,
        "content": {"application/json": content, **{kind: content for kind in FORMS}},
    }
