"""`attn-mt info`: what a run folder or checkpoint holds (languages, model size, steps, the
best validation, checkpoints) and the command that continues it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attn_mt.cli.app import app
from attn_mt.errors import UserError

if TYPE_CHECKING:
    from attn_mt.config.schema import TrainConfig


@app.command(epilog="Example: attn-mt info runs/multi30k_de_en")
def info(
    run: Annotated[Path, typer.Argument(metavar="RUN", help="A run folder or a .pt checkpoint.")],
) -> None:
    """Show a run's languages, model size, steps, best validation and checkpoints, and the
    command that continues it."""
    if not run.exists():
        raise UserError(f"{run}: no such run folder or checkpoint")
    folder = run if run.is_dir() else None
    if folder is not None and not (folder / "config.yaml").is_file():
        raise UserError(f"{run}: not a run folder (no config.yaml); give a train.out_dir")
    if folder is None and run.suffix != ".pt":
        raise UserError(f"{run}: not a run folder or a .pt checkpoint")
    from attn_mt.checkpoint import checkpoint_config, load_checkpoint, tokenizers_from  # torch
    from attn_mt.model.transformer import build_model, parameter_count

    checkpoints = sorted((folder / "checkpoints").glob("*.pt")) if folder else [run]
    main = next((p for p in checkpoints if p.name == "last.pt"), None) or next(
        (p for p in checkpoints if p.name == "best.pt"), checkpoints[0] if checkpoints else None
    )
    if main is None:
        assert folder is not None
        raise UserError(f"{run}: no checkpoints yet (nothing under {folder / 'checkpoints'})")
    state = load_checkpoint(main, mapped=True)  # last.pt's optimizer state is never read
    cfg = checkpoint_config(state, main)
    m = cfg.model
    src_tok, tgt_tok = tokenizers_from(state, main)
    parameters = parameter_count(build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size))
    print(f"{'run' if folder else 'checkpoint'}: {run}")
    print(f"languages: {cfg.data.in_words()}")
    print(
        f"model: {m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, "
        f"{m.heads} heads, d_ff {m.d_ff}; {parameters:,} parameters"
    )
    print(f"steps: {state['step']:,} (epoch {state.get('epoch', 0)})")
    print(f"best: {_best(folder, checkpoints, cfg.train)}")
    for path in checkpoints:
        print(f"checkpoint: {path.name}  {path.stat().st_size / 1e6:.1f} MB")
    if imported := state.get("imported"):  # `attn-mt import`: a pretrained model, not a run
        print(f"imported: from {imported.get('from')} ({imported.get('kind')})")
        print(f"fine-tune it with `attn-mt train --config FILE --init-from {run}`")
        return
    if folder is not None:
        from attn_mt.runfolder import continue_command, stopped_by

        stopped = stopped_by(folder, state["step"])
        if stopped is None:
            stopped = "max_steps" if 0 < cfg.train.max_steps <= state["step"] else "signal"
        print(continue_command(folder, stopped, cfg.train))


def _best(folder: Path | None, checkpoints: list[Path], t: TrainConfig) -> str:
    """The best validation record of the run's metrics.jsonl (by train.select_metric), or the
    checkpoint's own."""
    metric = t.select_metric
    records: list[dict[str, Any]] = []
    metrics = folder / "metrics.jsonl" if folder else None
    if metrics is not None and metrics.is_file():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if _validation(record, metric):
                records.append(record)
    if not records:
        from attn_mt.checkpoint import load_checkpoint

        state = load_checkpoint(checkpoints[0], mapped=True)
        found = state.get("metrics") or {}
        shown = ", ".join(f"{k} {v:.2f}" for k, v in found.items() if isinstance(v, float))
        return f"{shown} at step {state['step']}" if shown else "no validation yet"
    pick = max if t.higher_is_better else min
    best = pick(records, key=lambda r: r[metric])
    shown = ", ".join(
        f"{k} {v:.2f}"
        for k, v in best.items()
        if k not in ("step", "split") and isinstance(v, float)
    )
    on = best.get("sentences")  # a validation may score a subset (a budget's, a limit's)
    count = f" (on {on:,} validation sentences)" if type(on) is int else ""
    return f"valid {shown} at step {best['step']:,}{count}"


def _validation(record: Any, metric: str) -> bool:
    """Whether a metrics.jsonl record is a whole validation of the run (not a direction's) with
    its step and a number for `metric`; a row edited by hand or cut by a crash is passed over."""
    if not isinstance(record, dict) or record.get("split") != "valid" or "pair" in record:
        return False
    step, value = record.get("step"), record.get(metric)
    if type(step) is not int or isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)
