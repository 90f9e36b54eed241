"""`attn-mt serve`: the HTTP API (attn_mt.serve) over `attn_mt.load`, on uvicorn.

Every check is made before the port is bound: the model paths, the `[serve]` extra, the
decode settings and the device (by `attn_mt.load`), the models' pairs (`serve.routing`), the
beam against the vocabulary (a warm-up translation), the limits and the API key file; a
failure is one `attn-mt: error:` line and exit 2, as for `translate`. Listening beyond this
machine, or a key file others can read, is warned about.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    DecodeSetOption,
    DeviceOption,
    Precision,
    PrecisionOption,
    Prepack,
    PrepackOption,
    QuantizeOption,
    decode_settings,
    model_option,
)
from attn_mt.errors import UserError


def _limit(option: str, help_: str):
    """A positive integer option."""
    return typer.Option(option, metavar="N", min=1, help=help_)


MAX_WAIT_MS = 60_000  # a longer wait for company only holds requests


@app.command(epilog="Example: attn-mt serve -m runs/multi30k_de_en -m runs/multi30k_en_de")
def serve(
    model: Annotated[
        list[Path],
        model_option(
            "; give it more than once to serve several: models of the same language pairs "
            "form an ensemble, models of other pairs each answer their own."
        ),
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host", metavar="ADDRESS", help="Address to listen on (127.0.0.1: this machine only)."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", metavar="N", help="TCP port (0: any free one).")
    ] = 8000,
    set_: DecodeSetOption = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
    quantize: QuantizeOption = None,
    prepack: PrepackOption = Prepack.auto,
    max_batch_tokens: Annotated[
        int | None,
        _limit(
            "--max-batch-tokens",
            "Source tokens one batch across requests may hold, a beam line counting "
            "(K + 1) / 2 (default: the checkpoint's decode.batch_tokens).",
        ),
    ] = None,
    max_wait_ms: Annotated[
        float,
        typer.Option(
            "--max-wait-ms",
            metavar="MS",
            help="How long the oldest waiting request waits for others to batch with "
            f"(0: batch only what is already queued; at most {MAX_WAIT_MS}).",
        ),
    ] = 10.0,
    max_lines: Annotated[
        int, _limit("--max-lines", "Entries (paragraphs or HTML pages) per request.")
    ] = 64,
    max_chars: Annotated[
        int,
        _limit(
            "--max-chars",
            "Characters per request: its text (an HTML page's: the text of its blocks), terms, "
            "prefixes, avoided words and glossary together. A sentence longer than the model "
            "reads is translated in pieces.",
        ),
    ] = 100_000,
    max_body_bytes: Annotated[int, _limit("--max-body-bytes", "Bytes per request.")] = 4 << 20,
    max_beam: Annotated[int, _limit("--max-beam", "Widest beam or n-best a request gets.")] = 32,
    max_terms: Annotated[int, _limit("--max-terms", "Terms (constraints) per line.")] = 8,
    max_avoid: Annotated[int, _limit("--max-avoid", "Avoided words per request.")] = 64,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            "--api-key-file",
            metavar="FILE",
            help="Every route but /health then needs 'Authorization: Bearer KEY' (KEY: the "
            "file's first line, UTF-8).",
        ),
    ] = None,
) -> None:
    """Serve models over HTTP: POST /v1/translate, LibreTranslate's /translate, a page at /."""
    from attn_mt.paths import resolve_checkpoint

    for path in model:
        resolve_checkpoint(path)
    _check_extra()
    if not (math.isfinite(max_wait_ms) and 0 <= max_wait_ms <= MAX_WAIT_MS):
        raise UserError(f"--max-wait-ms {max_wait_ms:g}: give 0 to {MAX_WAIT_MS} milliseconds")
    api_key = _read_key(api_key_file)
    decode = decode_settings(set_)
    import attn_mt  # torch: once the arguments are good
    from attn_mt.serve.app import create_app
    from attn_mt.serve.routing import load_routes
    from attn_mt.serve.service import Limits, Service, new_worker

    def load(paths: list[Path]):
        return attn_mt.load(
            paths,
            device=device,
            precision=precision.value,
            quantize=quantize,
            prepack=prepack.value_for_load,
            decode=decode,
        )

    def load_and_warm():
        routes = load_routes(model, load)
        for route in routes:  # a multilingual model needs one of its languages
            translator = route.translator
            translator.translate_nbest(["a"], tgt_lang=translator.target_languages[0])  # beam
        return routes

    worker = new_worker(max_wait_ms)
    routes = worker.on_worker(load_and_warm)  # the worker alone computes (serve.batcher)
    limits = Limits(max_lines, max_chars, max_body_bytes, max_beam, max_terms, max_avoid)
    budget = max_batch_tokens or routes[0].translator.config.decode.batch_tokens
    service = Service(routes, limits, budget, max_wait_ms, worker)
    listener = _bind(host, port)
    _warn_exposed(host, api_key_file)
    _run(create_app(service, api_key), listener)


def _check_extra() -> None:
    """FastAPI and uvicorn are the optional `[serve]` extra."""
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"serve needs {' and '.join(missing)}: pip install 'attn-mt[serve]'")


def _read_key(path: Path | None) -> str | None:
    """The API key: the first line of `path` (UTF-8, a byte-order mark dropped), stripped; it
    must not be empty nor hold a control character (no client could send it)."""
    if path is None:
        return None
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise UserError(f"--api-key-file {path}: not UTF-8 text") from None
    except OSError as err:
        raise UserError(f"--api-key-file {path}: cannot read ({err.strerror or err})") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise UserError(f"--api-key-file {path}: the first line (the key) is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UserError(
            f"--api-key-file {path}: the key holds a control character, which no client "
            "can send in a header"
        )
    return key


def _warn_exposed(host: str, key_file: Path | None) -> None:
    """Warn of a server reachable beyond this machine, and of a key others can read."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        print(
            f"attn-mt: warning: --host {host} listens beyond this machine; keep it behind a "
            "reverse proxy with TLS"
            + (
                "" if key_file else ", and give --api-key-file, or anyone who reaches it may use it"
            ),
            file=sys.stderr,
        )
    if key_file is not None and key_file.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
        print(
            f"attn-mt: warning: --api-key-file {key_file} is readable by other users "
            f"(chmod 600 {key_file})",
            file=sys.stderr,
        )


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, bound here so that a taken port is a one-line error."""
    try:
        listener = socket.create_server((host, port), reuse_port=False)
    except (OSError, OverflowError) as err:
        reason = getattr(err, "strerror", None) or err
        raise UserError(f"--host {host} --port {port}: cannot listen ({reason})") from None
    return listener


def _run(application, listener: socket.socket) -> None:
    """Serve until SIGTERM or Ctrl-C; SIGTERM finishes the requests in flight and exits 0."""
    import uvicorn

    host, port = listener.getsockname()[:2]
    print(f"attn-mt: serving on http://{host}:{port} (API: /docs)", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        application, log_level="warning", access_log=False, timeout_graceful_shutdown=None
    )
    # uvicorn raises the signal again once it has shut down gracefully: with this handler,
    # SIGTERM then ends the command normally (exit 0) instead of killing it.
    signal.signal(signal.SIGTERM, lambda *_: None)
    stopping = application.state.stopping

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if stopping.is_set():  # a second signal while the first drains: stop at once
                _stop_at_once(sig)
            stopping.set()  # a request body still arriving is given up soon (serve.guard)
            super().handle_exit(sig, frame)

    Server(config).run(sockets=[listener])
    print("attn-mt: server stopped", file=sys.stderr)


def _stop_at_once(sig: int) -> None:
    """End the process now, the requests in flight dropped, with one line and the shell's
    status for the signal (130 for Ctrl-C): unwinding uvicorn's event loop instead would cancel
    each of them and log every cancellation as a chained traceback. The server writes no file,
    so nothing is left half written."""
    how = "interrupted" if sig == signal.SIGINT else "terminated"
    print(f"attn-mt: {how} while stopping; the requests in flight are dropped", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + sig)
