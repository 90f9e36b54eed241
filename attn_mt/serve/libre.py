"""LibreTranslate's API as its clients call it: `POST /translate` (`q`, `source` or `auto`,
`target`, `format` text or html, `alternatives`, `api_key`), `POST /detect`, `GET /languages`,
each body JSON or a form (urlencoded or multipart). A pair the server does not translate, or a
source it cannot tell, is refused with 400 as LibreTranslate refuses it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from attn_mt.decode.request import Request as DecodeRequest
from attn_mt.errors import UserError
from attn_mt.serve.guard import FORMS, Text, read_body
from attn_mt.serve.service import Asked, Service


class LibreRequest(BaseModel):
    """POST /translate, as LibreTranslate defines it."""

    model_config = ConfigDict(extra="forbid")

    q: Text | list[Text] = Field(description="The text, or a list of texts, to translate.")
    source: Text = Field("auto", description="Its language, or 'auto' to detect it.")
    target: Text = Field(description="The language to translate into.")
    format: Literal["text", "html"] = Field("text", description="'html': keep the markup.")
    api_key: Text | None = None
    alternatives: int = Field(0, ge=0, description="Other translations to add, best first.")


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


def add_libre_routes(app: FastAPI, service: Service, check_lines: Any) -> None:
    """LibreTranslate's routes; `check_lines(lines)` refuses what is past the limits."""
    schema = {"requestBody": _body_schema(LibreRequest)}

    @app.get("/languages")
    async def languages() -> list[dict[str, Any]]:
        """LibreTranslate: `[{"code", "name", "targets"}]`, every pair served."""
        return service.router.languages()

    @app.post("/detect", openapi_extra={"requestBody": _body_schema(DetectRequest)})
    async def detect(request: Request) -> list[dict[str, Any]]:
        """LibreTranslate: the served source languages `q` may be in, likeliest first."""
        body = await parsed(request, DetectRequest)
        check_lines([body.q])
        return service.router.detect(body.q)

    @app.post("/translate", openapi_extra=schema)
    async def translate(request: Request) -> dict[str, Any]:
        """LibreTranslate: `q` (a str or a list), `source`, `target` -> `translatedText`."""
        body = await parsed(request, LibreRequest)
        lines = [body.q] if isinstance(body.q, str) else body.q
        check_lines(lines)
        widest = service.limits.max_beam
        if body.alternatives + 1 > widest:
            raise HTTPException(
                413, f"alternatives {body.alternatives}: more than --max-beam {widest} - 1"
            )
        detected = (
            [service.router.detect(line)[0] for line in lines] if body.source == "auto" else None
        )
        sources = [d["language"] for d in detected] if detected else [body.source] * len(lines)
        found = await _translate(service, lines, sources, body, request.is_disconnected)
        reply: dict[str, Any] = {"translatedText": [entries[0].text for entries in found]}
        if body.alternatives:
            reply["alternatives"] = [[e.text for e in entries[1:]] for entries in found]
        if detected is not None:
            reply["detectedLanguage"] = detected
        if isinstance(body.q, str):
            reply = {key: value[0] for key, value in reply.items()}
        return reply


async def _translate(
    service: Service, lines: list[str], sources: list[str], body: LibreRequest, disconnected: Any
) -> list[list[Any]]:
    """The n-best of each line, each group of one source language on its own route."""
    groups: dict[str, list[int]] = {}
    for row, source in enumerate(sources):
        groups.setdefault(source, []).append(row)
    asked: dict[str, Asked] = {}
    for source in groups:
        try:
            asked[source] = service.find(source, body.target, ("source", "target"))
        except UserError as err:
            raise HTTPException(400, str(err)) from None
    request = DecodeRequest(nbest=body.alternatives + 1)
    translate = service.translate_html if body.format == "html" else service.translate
    found = await asyncio.gather(
        *(
            translate([lines[r] for r in rows], request, disconnected, asked[source])
            for source, rows in groups.items()
        )
    )
    results: list[list[Any]] = [[] for _ in lines]
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
