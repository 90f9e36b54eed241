"""What both exports (CTranslate2's `ct2.py`, transformers' `hf.py`) share: the model a target
can express (`check_exportable`), the output folder checked up front and written whole or not at
all (`check_out_dir`, `staged_folder`), the license the folder states, and the one output limit
an engine that takes one per call gets (`longest_output`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import torch

from attn_mt.config.schema import Config, DecodeConfig
from attn_mt.decode.generate import max_output_lengths
from attn_mt.errors import UserError
from attn_mt.fileio import remove_stale_temps, sigterm_unwinds, temp_prefix, umask
from attn_mt.model.vocab import EOS_ID
from attn_mt.paths import check_output_dir

SINUSOIDAL_ROWS = 1024  # our table grows on demand; an exported model needs a fixed one


def check_exportable(config: Config, supported: dict[str, tuple], engine: str) -> None:
    """Refuse, naming the config key, a model `engine` cannot express (`supported`: the
    model.* values it can)."""
    for key, values in supported.items():
        value = getattr(config.model, key)
        if value not in values:
            raise UserError(
                f"model.{key}: {value!r} cannot be exported to {engine}, which supports "
                f"model.{key} {' or '.join(map(repr, values))} only"
            )


def longest_output(decode: DecodeConfig, max_output_len: int | None) -> int:
    """Our output limit, <eos> included, for the longest source (decode.max_input_len tokens
    and <eos>): the one limit an engine that takes one per call gets."""
    longest = torch.full((1, decode.max_input_len + 1), EOS_ID)  # (1, S): any non-pad ids
    return int(max_output_lengths(longest, decode.max_len_a, decode.max_len_b, max_output_len))


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A staging folder beside `out`, moved into place whole when the block succeeds: a failed
    export leaves neither a half-written folder nor a damaged earlier one.

    A link `out` is followed: the folder it names is replaced, the link kept. The staging
    folder is named for this process (`fileio.temp_prefix`): a SIGTERM removes it, and one
    that a SIGKILL left is removed by the next export to `out`.
    """
    out = Path(os.path.realpath(out))
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]  # deepest first
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    done = False
    with sigterm_unwinds():
        staging = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".staging", dir=out.parent))
        try:
            staging.chmod(0o777 & ~umask())  # mkdtemp's 0700 would hide the model from the team
            yield staging
            for path in staging.rglob("*"):  # some writers (safetensors) make their files 0600
                if path.is_file():
                    path.chmod(0o666 & ~umask())
            if out.exists():
                shutil.rmtree(out)
            os.replace(staging, out)
            done = True
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            for folder in created if not done else ():  # a refused export leaves no empty parents
                with suppress(OSError):
                    folder.rmdir()


LICENSE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")


def check_license(license: str) -> None:
    """An SPDX identifier (`MIT`, `Apache-2.0`, `cc-by-4.0`) or `unknown`: one word, as the
    card's YAML front matter takes it."""
    if not LICENSE_PATTERN.fullmatch(license):
        raise UserError(
            f"--license {license!r}: not an SPDX license identifier (e.g. MIT, Apache-2.0, "
            "cc-by-4.0), or unknown"
        )


def license_note(license: str) -> str:
    """What the exported folder says of its license."""
    if license == "unknown":
        return (
            "No license was given at export (`attn-mt export --license SPDX-ID`): ask the "
            "model's owner before using it. The training data's own licenses apply as well."
        )
    return (
        f"`{license}` (SPDX), as given at export. The training data's own licenses apply as well."
    )


def check_out_dir(out: Path, checkpoint: Path, force: bool) -> None:
    """`out` may be new or empty; a non-empty folder only with --force, never the run itself."""
    check_output_dir(out)
    if checkpoint.resolve().is_relative_to(out.resolve()):
        raise UserError(f"--out {out}: holds the checkpoint being exported; choose another folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"--out {out}: folder exists and is not empty; add --force to replace it")
