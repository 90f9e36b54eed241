"""`attn-mt train`: a run started from a config (or continued), through `train.run.start_run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app, exit_on_signal
from attn_mt.cli.options import ConfigSetOption, DeviceOption
from attn_mt.errors import UserError


@app.command(
    epilog="Example: attn-mt train -c configs/multi30k_de_en.yaml --set train.max_minutes=30"
)
def train(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN_DIR",
            help="With --resume instead of --config: the run folder to continue.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", metavar="FILE", help="The YAML config file."),
    ] = None,
    set_: ConfigSetOption = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue a run: the one in the config's train.out_dir, or RUN_DIR "
            "(`attn-mt train --resume RUN_DIR` reads RUN_DIR/config.yaml).",
        ),
    ] = False,
    init_from: Annotated[
        Path | None,
        typer.Option(
            "--init-from",
            metavar="PATH",
            help="Start a new run from a run folder (its best.pt) or .pt file: its weights, "
            "SentencePiece models, and the model, tokenizer and decode keys the config leaves "
            "out (sets train.init_from; an imported model fine-tunes so).",
        ),
    ] = None,
    device: DeviceOption = "auto",
) -> None:
    """Train a model: SentencePiece, Transformer, validation BLEU, checkpoints, TensorBoard."""
    # The arguments, the config and the run folder are checked before torch is imported
    # (seconds): a mistake is reported at once.
    from attn_mt.config.file import load_config

    if init_from is not None and resume:
        raise UserError("--init-from starts a new run and --resume continues one; give only one")
    if run_dir is not None and not run_dir.is_dir() and run_dir.suffix in (".yaml", ".yml"):
        raise UserError(
            f"train: {run_dir} is a config file; give it as `attn-mt train --config {run_dir}`"
        )
    if run_dir is not None and not resume:
        raise UserError(
            f"train: {run_dir} given without --resume; continue that run with "
            f"`attn-mt train --resume {run_dir}`, or start one with --config FILE"
        )
    if run_dir is not None and config is not None:
        raise UserError("train: give --config FILE [--resume] or --resume RUN_DIR, not both")
    if run_dir is None and config is None:
        raise UserError("train: give --config FILE (or --resume RUN_DIR to continue a run)")
    if run_dir is not None:
        if not (run_dir / "config.yaml").is_file():
            raise UserError(
                f"--resume {run_dir}: not a run folder (no config.yaml); give the train.out_dir "
                "of an earlier run"
            )
        # The folder is the run, wherever it was started from: its out_dir is RUN_DIR itself.
        config, set_ = run_dir / "config.yaml", [f"train.out_dir={run_dir}", *(set_ or [])]
    assert config is not None  # one of --config and RUN_DIR, checked above
    overrides = [*(set_ or []), *([f"train.init_from={init_from}"] if init_from else [])]
    cfg = load_config(config, overrides)
    run = Path(cfg.train.out_dir)
    saved = config.resolve() == (run / "config.yaml").resolve()
    if saved and not resume and (run / "checkpoints" / "last.pt").is_file():
        raise UserError(
            f"{config}: that is the saved config of the run in {run}; to continue that run: "
            f"`attn-mt train --resume {run}` (with --set train.max_steps=N to go further); "
            "to start a new one from it, copy it and change train.out_dir"
        )
    from attn_mt.world import world_from_env

    main_process = world_from_env().is_main  # malformed torchrun variables: one line, here
    from attn_mt.cli import progress
    from attn_mt.train.run import start_run

    with progress.training(enabled=main_process) as display:
        result = start_run(cfg, resume=resume, device=device, monitor=display)
    exit_on_signal(result.stop_signal)
