"""Inductor settings a benchmark is asked for (`--inductor KEY=VALUE`), read as their types and
held for the whole process while it runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from attn_mt.precision import INDUCTOR_OPTIONS, MISSING, inductor_setting


def inductor_settings(pairs: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs as Inductor settings, each VALUE read as the setting's current type
    (1/0 or true/false for a flag, an int for a number); a malformed pair or a KEY this
    torch's Inductor lacks is a ValueError."""
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not text:
            raise ValueError(f"{pair!r}: give KEY=VALUE")
        current = inductor_setting(key)
        if current is MISSING:
            raise ValueError(f"{key}: not an Inductor setting of torch {torch.__version__}")
        if isinstance(current, bool):
            flags = {"1": True, "true": True, "0": False, "false": False}
            if text.lower() not in flags:
                raise ValueError(f"{pair!r}: {key} is a flag (1/0, true/false)")
            settings[key] = flags[text.lower()]
        elif isinstance(current, int) or current is None:
            try:
                settings[key] = int(text)
            except ValueError:
                raise ValueError(f"{pair!r}: {key} is a number") from None
        else:
            settings[key] = text
    return settings


@contextlib.contextmanager
def process_settings(settings: dict[str, Any], device_type: str) -> Iterator[None]:
    """`settings` for everything compiled inside, restored after: in Inductor's config, and
    over attn-mt's own options for `device_type` (`precision.INDUCTOR_OPTIONS`), which every
    torch.compile of attn-mt's is given and which would otherwise set a setting back for its
    graphs."""
    import torch._inductor.config  # here: Inductor loads only where it is asked for

    had = device_type in INDUCTOR_OPTIONS
    saved = dict(INDUCTOR_OPTIONS.get(device_type, {}))
    INDUCTOR_OPTIONS[device_type] = saved | settings
    try:
        with torch._inductor.config.patch(settings):
            yield
    finally:
        if had:
            INDUCTOR_OPTIONS[device_type] = saved
        else:
            del INDUCTOR_OPTIONS[device_type]
