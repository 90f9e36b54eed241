"""What stands between a client and the routes: the API key, the size and pace of a request
body, and text that is not valid Unicode. Each refusal is a JSON `{"error": ...}` with a 4xx
status (or 503 while the server stops), never a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
from collections.abc import Awaitable, Callable
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import AfterValidator
from starlette.exceptions import HTTPException

BODY_WAIT_S = 30.0  # how long a body may pause between two of its chunks
STOPPING_WAIT_S = 2.0  # ... once the server is stopping
# The routes that need no key (LibreTranslate's front end reads its settings to learn that
# one is needed).
OPEN_PATHS = ("/health", "/frontend/settings")
FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def _valid_unicode(text: str) -> str:
    """Refuse a string holding a lone surrogate (JSON's "\\ud800"), which is no text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"holds a lone surrogate (U+{ord(text[err.start]):04X}), not valid Unicode"
        ) from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]  # a request's str: valid Unicode


def same_key(given: bytes, key: bytes) -> bool:
    """Whether `given` is the key, compared in constant time."""
    return hmac.compare_digest(given, key)


def key_checker(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """The dependency that checks the bearer key (or LibreTranslate's `api_key` field of a
    JSON or form body), compared as UTF-8 bytes in constant time."""
    key = api_key.encode("utf-8") if api_key is not None else b""

    async def check(request: Request) -> None:
        if api_key is None or request.url.path in OPEN_PATHS:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # Header values arrive as Latin-1: their bytes are the bytes the client sent.
        if scheme.lower() == "bearer" and same_key(token.strip().encode("latin-1"), key):
            return
        given = await _body_key(request) if request.url.path in ("/translate", "/detect") else None
        if given is not None and same_key(given, key):
            return
        raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY'")

    return check


async def _body_key(request: Request) -> bytes | None:
    """LibreTranslate's `api_key` field of a JSON or form body, as UTF-8 bytes, if any."""
    try:
        body = await read_body(request)
    except ValueError:  # not JSON or a form: no key there
        return None
    key = body.get("api_key")
    if not isinstance(key, str):
        return None
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:
        return None


async def read_body(request: Request) -> dict[str, Any]:
    """A JSON object or a form as a dict (a ValueError if it is neither). A urlencoded form is
    read as UTF-8, its raw bytes and its %-escapes alike (as LibreTranslate reads it; starlette
    takes raw bytes as Latin-1)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == FORMS[0]:
        try:
            text = (await request.body()).decode("utf-8")
            return dict(parse_qsl(text, keep_blank_values=True, errors="strict"))
        except UnicodeDecodeError as err:
            raise ValueError(f"a form that is not UTF-8 ({err.reason})") from None
    if kind in FORMS:
        form = await request.form()
        return {k: v for k, v in form.multi_items() if isinstance(v, str)}
    body = await request.json()
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    return body


class BodyGuard:
    """ASGI middleware for request bodies: past `limit` bytes refused with 413 (by its
    Content-Length at once, or as it streams in, chunked or not); a body that pauses
    BODY_WAIT_S between chunks refused with 408, and one still arriving while the server
    stops (`stopping` set) with 503 after STOPPING_WAIT_S, so a stalled client never holds a
    shutdown."""

    def __init__(self, app: Any, limit: int, stopping: threading.Event):
        self.app, self.limit, self.stopping = app, limit, stopping

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _refuse(send, 413, f"request body over --max-body-bytes {self.limit}")
            return
        seen, complete = 0, False

        async def guarded() -> dict:
            nonlocal seen, complete
            if complete:  # after the body: the client's disconnect, whenever it comes
                return await receive()
            message = await self._next(receive)
            seen += len(message.get("body", b""))
            complete = not message.get("more_body", False)
            if seen > self.limit:
                raise HTTPException(413, f"request body over --max-body-bytes {self.limit}")
            return message

        await self.app(scope, guarded, send)

    async def _next(self, receive: Any) -> dict:
        """The next message of the body, within the time a body may pause."""
        arriving = asyncio.ensure_future(receive())
        waited = 0.0
        while True:
            try:
                done, _ = await asyncio.wait({arriving}, timeout=0.25)
            except asyncio.CancelledError:  # the caller gave up (a disconnect check)
                arriving.cancel()
                raise
            if done:
                return arriving.result()
            waited += 0.25
            if waited >= (STOPPING_WAIT_S if self.stopping.is_set() else BODY_WAIT_S):
                arriving.cancel()
                if self.stopping.is_set():
                    raise HTTPException(503, "the server is stopping; send the request again")
                raise HTTPException(408, f"the request body paused for {BODY_WAIT_S:g} s")


async def _refuse(send: Any, status: int, error: str) -> None:
    """Answer `{"error": error}` with `status` without reading the body."""
    response = JSONResponse({"error": error}, status_code=status)
    await response({"type": "http"}, _no_body, send)


async def _no_body() -> dict[str, Any]:
    """The ASGI `receive` of a response that reads nothing."""
    return {"type": "http.disconnect"}
