"""Checkpoints written while training goes on: `CheckpointWriter` copies a checkpoint's tensors
to the CPU (the only part that waits), then writes the files on a background thread.

Each file is still written atomically (`checkpoint.save_checkpoint`: a temp file renamed over
the old one), so last.pt is always a complete checkpoint, the previous one until the new one is
whole. At most one write is in flight: a save waits for the one before it, so the files land in
order and the host never holds more than one extra copy of the weights and optimizer state.
A failed write (a full disk) is raised at the next save or at `wait`, which the end of a run
calls before it returns. `abandon` (a second Ctrl-C) gives up the write in flight: the file
being written is finished but removed, not renamed, so each checkpoint stays the last one
completed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attn_mt.checkpoint import WriteAbandoned, save_checkpoint


def cpu_copy(value: Any, copies: dict[int, torch.Tensor] | None = None) -> Any:
    """`value` with every tensor in it copied to the CPU (a new tensor even on the CPU), and
    every dict, list and tuple rebuilt, so that training on may change none of it. A tensor
    met again (in `copies`, by identity: the same weights in best.pt, step_N.pt and last.pt)
    is copied once."""
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        if id(value) not in copies:  # the originals outlive the call, so no id is reused
            copies[id(value)] = value.detach().to("cpu", copy=True)
        return copies[id(value)]
    if isinstance(value, dict):
        return {k: cpu_copy(v, copies) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v, copies) for v in value)
    return value


class CheckpointWriter:
    """Writes checkpoints on one background thread, one save at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._abandon = threading.Event()

    def submit(self, files: Sequence[tuple[dict[str, Any], Path]], drop: Sequence[Path]) -> None:
        """Write each (state, path) of `files` in order, then delete the `drop` paths, in the
        background; the states are copied before this returns."""
        self.wait()
        tensors: dict[int, torch.Tensor] = {}  # each copied once, whichever files hold it
        copies = [(cpu_copy(state, tensors), path) for state, path in files]
        # Not a daemon: a process that ends (or fails) with a write in flight finishes it.
        self._thread = threading.Thread(
            target=self._write, args=(copies, list(drop)), name="attn-mt checkpoint writer"
        )
        self._thread.start()

    def _write(self, files: list[tuple[dict[str, Any], Path]], drop: list[Path]) -> None:
        try:
            for state, path in files:
                save_checkpoint(state, path, self._abandon)
            for path in drop:
                path.unlink(missing_ok=True)
        except WriteAbandoned:
            pass  # what was asked: the earlier files stay as they were
        except BaseException as err:  # noqa: BLE001 - raised on the training thread instead
            self._error = err

    def wait(self) -> None:
        """Wait for the write in flight, if any; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def abandon(self) -> None:
        """Give up the write in flight (its current file is removed once torch.save returns,
        never renamed into place) and write nothing more."""
        self._abandon.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None
