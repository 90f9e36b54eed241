"""`attn-mt serve`: the HTTP API (attn_mt.serve) over `attn_mt.load`, on uvicorn.

Every check is made before the port is bound: the model paths, the `[serve]` extra, the
decode settings and the device (by `attn_mt.load`), the beam against the vocabulary (a
warm-up translation), the limits and the API key file; a failure is one `attn-mt: error:`
line and exit 2, as for `translate`.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    DecodeSetOption,
    DeviceOption,
    ModelsOption,
    Precision,
    PrecisionOption,
    Prepack,
    PrepackOption,
    QuantizeOption,
    decode_settings,
)
from attn_mt.errors import UserError


def _limit(option: str, help_: str):
    """A positive integer option."""
    return typer.Option(option, metavar="N", min=1, help=help_)


@app.command(epilog="Example: attn-mt serve -m runs/multi30k --port 8000")
def serve(
    model: ModelsOption,
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
            min=0,
            help="How long the oldest waiting request waits for others to batch with "
            "(0: batch only what is already queued).",
        ),
    ] = 10.0,
    max_lines: Annotated[int, _limit("--max-lines", "Lines per request.")] = 64,
    max_chars: Annotated[int, _limit("--max-chars", "Characters per line.")] = 2000,
    max_body_bytes: Annotated[int, _limit("--max-body-bytes", "Bytes per request.")] = 1 << 20,
    max_beam: Annotated[int, _limit("--max-beam", "Widest beam or n-best a request gets.")] = 32,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            "--api-key-file",
            metavar="FILE",
            help="Every route but /health then needs 'Authorization: Bearer KEY' (KEY: the "
            "file's first line).",
        ),
    ] = None,
) -> None:
    """Serve the model over HTTP: POST /v1/translate, LibreTranslate's /translate, a page at /."""
    from attn_mt.fileio import resolve_checkpoint

    for path in model:
        resolve_checkpoint(path)
    _check_extra()
    api_key = _read_key(api_key_file)
    decode = decode_settings(set_)
    from attn_mt.cli.decode import load_translator  # torch: once the arguments are good
    from attn_mt.serve.app import create_app
    from attn_mt.serve.service import Limits, Service

    translator = load_translator(model, device, precision, quantize, prepack, decode)
    warm_up = translator.target_languages[0]  # a multilingual model needs one of its languages
    translator.translate_nbest(["a"], tgt_lang=warm_up)  # checks the beam; warms the kernels
    limits = Limits(max_lines, max_chars, max_body_bytes, max_beam)
    budget = max_batch_tokens or translator.config.decode.batch_tokens
    service = Service(translator, list(model), limits, budget, max_wait_ms)
    listener = _bind(host, port)
    _run(create_app(service, api_key), listener)


def _check_extra() -> None:
    """FastAPI and uvicorn are the optional `[serve]` extra."""
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"serve needs {' and '.join(missing)}: pip install 'attn-mt[serve]'")


def _read_key(path: Path | None) -> str | None:
    """The API key: the first line of `path`, which must not be empty."""
    if path is None:
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or err
        raise UserError(f"--api-key-file {path}: cannot read ({reason})") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise UserError(f"--api-key-file {path}: the first line (the key) is empty")
    return key


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
    uvicorn.Server(config).run(sockets=[listener])
    print("attn-mt: server stopped", file=sys.stderr)
