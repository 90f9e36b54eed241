"""`attn-mt distill`: a student trained on its teacher's translations of the training sources.

Every check comes first (the options, the teachers' paths, the student config, the run folder;
then, once torch loads them, the teachers' direction), then the teacher (or the ensemble of
teachers) translates each training corpus's sources into `OUT_DIR/distilled/corpusK.nbest`
through `translate --output FILE`'s resumable job (`cli/job.py`): a distill stopped at any
moment and started again with the same command continues where it stopped. `attn_mt.distill`
assembles the student's corpus from them, and the student trains through `attn-mt train` on
`distilled/student.yaml`: the student config with `data.train` replaced by that corpus.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import ConfigSetOption, DeviceOption
from attn_mt.errors import UserError, named

if TYPE_CHECKING:
    from attn_mt.cli.job import LineFields
    from attn_mt.config.data import TrainCorpus
    from attn_mt.config.schema import Config
    from attn_mt.decode.request import Request
    from attn_mt.decode.translator import Translator
    from attn_mt.distill import DistilledFolder, DistillOptions


@app.command(
    epilog="Example: attn-mt distill --teacher runs/multi30k_de_en "
    "--config configs/multi30k_de_en_student.yaml"
)
def distill(
    teacher: Annotated[
        list[Path] | None,
        typer.Option(
            "--teacher",
            "-t",
            metavar="PATH",
            help="The teacher: a run folder (its best.pt) or a .pt file; give it more than once "
            "for an ensemble.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", metavar="FILE", help="The student's YAML config."),
    ] = None,
    beam: Annotated[
        int | None,
        typer.Option(
            "--beam", "-b", metavar="N", help="The teacher's beam (default: its decode.beam)."
        ),
    ] = None,
    set_: ConfigSetOption = None,
    keep_original: Annotated[
        float,
        typer.Option(
            "--keep-original",
            metavar="F",
            help="Add back this share of the original pairs (0 to 1).",
        ),
    ] = 0.0,
    drop_worst: Annotated[
        float,
        typer.Option(
            "--drop-worst",
            metavar="F",
            help="Leave out this share of the pairs, those the teacher scored worst (per token).",
        ),
    ] = 0.0,
    nbest_chrf: Annotated[
        int,
        typer.Option(
            "--nbest-chrf",
            metavar="N",
            help="Take the teacher's translation closest to the reference by chrF among its "
            "N best (0 = off: its best).",
        ),
    ] = 0,
    device: DeviceOption = "auto",
) -> None:
    """Translate the student config's training sources with the teacher, then train the student
    on the teacher's translations (sequence-level knowledge distillation).

    Stopped at any moment, the same command continues the translation (or the training)."""
    from attn_mt.config.file import load_config
    from attn_mt.distill import DistilledFolder, DistillOptions, student_corpora, student_pair
    from attn_mt.fileio import resolve_checkpoint
    from attn_mt.world import world_from_env

    if not teacher or config is None:
        raise UserError("distill: give --teacher PATH (once or more) and --config STUDENT.yaml")
    cfg = load_config(config, set_ or [])
    options = DistillOptions(beam, keep_original, drop_worst, nbest_chrf, cfg.train.seed)
    options.check()
    try:
        checkpoints = [resolve_checkpoint(path) for path in teacher]
    except UserError as err:
        raise UserError(f"--teacher {err}") from None
    if world_from_env().distributed:
        raise UserError(
            "distill runs in one process: start it without torchrun (a large corpus can be "
            "translated in parts with `attn-mt translate --shard I/N`, then trained on)"
        )
    pair = student_pair(cfg.data)
    corpora = student_corpora(cfg.data)
    folder = DistilledFolder.of_run(cfg.train.out_dir, pair)
    resume = _check_run_folder(cfg, folder)
    student = _student_config(cfg, folder)
    translator, request = _teachers(checkpoints, teacher, device, options, pair)
    from attn_mt.cli.decode import record_settings
    from attn_mt.cli.job import LineFields
    from attn_mt.cli.options import NbestFormat

    fields = LineFields(options.nbest, NbestFormat.marian, prefix=False, constraints=False)
    settings = record_settings(translator, request, fields, checkpoints)
    settings |= {"distill": options.record(), "corpora": [c.src for c in corpora]}
    _claim(folder, settings, student)
    try:
        if not folder.assembled():
            _translate(translator, request, fields, corpora, folder, settings)
            from attn_mt.distill import assemble

            print(f"distill: {assemble(corpora, folder, options).summary()}", file=sys.stderr)
    except KeyboardInterrupt:
        print("attn-mt: distill: interrupted; the same command continues", file=sys.stderr)
        raise typer.Exit(130) from None
    del translator
    from attn_mt.cli.train import train

    print(f"distill: training the student on {named(folder.corpus[1])}", file=sys.stderr)
    student_config = folder.root / "student.yaml"
    train(None, student_config, None, resume=resume, init_from=None, device=device)


def _check_run_folder(cfg: Config, folder: DistilledFolder) -> bool:
    """The student's run folder, checked before any translation: whether its training is
    resumed (a distill's run that has begun), a run of something else refused."""
    from attn_mt.fileio import check_output_dir
    from attn_mt.runfolder import RUN_ENTRIES, check_run_start, is_locked

    out = Path(cfg.train.out_dir)
    resume = (out / "checkpoints" / "last.pt").is_file()
    if resume and not folder.assembled():
        raise UserError(
            f"{out}: already holds a run not trained by distill (no distilled corpus in it); "
            "choose another train.out_dir"
        )
    if is_locked(out):
        raise UserError(
            f"{out}: another attn-mt train or distill is training in this folder; wait for it "
            "to end or choose another train.out_dir"
        )
    started = [name for name in RUN_ENTRIES if (out / name).exists()]
    if not resume and started and folder.assembled():  # killed before its first checkpoint
        raise UserError(
            f"{out}: holds a student run stopped before its first checkpoint; delete its "
            f"{', '.join(started)} (keep distilled/, the teacher's work) and run distill again"
        )
    check_run_start(out, resume)
    check_output_dir(folder.root, "train.out_dir's distilled folder")
    return resume


def _student_config(cfg: Config, folder: DistilledFolder) -> dict[str, Any]:
    """The student config training on the distilled corpus (its validation and test as they
    are), as `distilled/student.yaml` will hold it; checked now, before any translation."""
    from attn_mt.config.file import config_from_dict

    raw = cfg.to_dict()
    src, tgt = folder.corpus
    raw["data"]["train"] = {"src": str(src), "tgt": str(tgt)}
    raw["train"]["out_dir"] = str(Path(cfg.train.out_dir).absolute())
    config_from_dict(raw)
    return raw


def _teachers(
    checkpoints: list[Path], names: list[Path], device: str, options: DistillOptions, pair: str
) -> tuple[Translator, Request]:
    """The teacher (an ensemble for several), refused if it does not translate `pair`, and the
    search request of its n-best."""
    from attn_mt.cli.decode import load_translator
    from attn_mt.cli.options import Precision, Prepack, decode_settings
    from attn_mt.decode.request import Request
    from attn_mt.distill import check_teacher
    from attn_mt.precision import resolve_device

    place = str(resolve_device(device))
    decode = decode_settings(None, options.beam)
    translator = load_translator(checkpoints, place, Precision.fp32, None, Prepack.auto, decode)
    tgt_lang = check_teacher(translator.config.data, pair, str(names[0]))
    return translator, Request(beam=options.beam, nbest=options.nbest, tgt_lang=tgt_lang)


def _claim(folder: DistilledFolder, settings: dict[str, Any], student: dict[str, Any]) -> None:
    """The distilled folder, its record and `student.yaml`. The record is written on the first
    run; a later run must have the same teachers, decode settings, options and corpora, or it
    would mix two teachers' work."""
    import yaml

    from attn_mt.cli.partial import difference
    from attn_mt.fileio import atomic_write, os_reason

    if folder.record.is_file():
        made = json.loads(folder.record.read_text(encoding="utf-8"))
        what = difference(made, settings)
        if what is not None:
            raise UserError(
                f"{named(folder.root)} was made with {what}; give the same teachers and "
                "options, or delete that folder (or choose another train.out_dir)"
            )
    try:
        folder.root.mkdir(parents=True, exist_ok=True)
        with atomic_write(folder.record) as out:
            out.write(json.dumps(settings, indent=1).encode("utf-8"))
        with atomic_write(folder.root / "student.yaml") as out:
            out.write(yaml.safe_dump(student, sort_keys=False).encode("utf-8"))
    except OSError as err:
        raise UserError(f"{named(folder.root)}: cannot write ({os_reason(err)})") from None


def _translate(
    translator: Translator,
    request: Request,
    fields: LineFields,
    corpora: list[TrainCorpus],
    folder: DistilledFolder,
    settings: dict[str, Any],
) -> None:
    """Each corpus's sources into the teacher's n-best file, continued where a partial
    translation was left; a corpus already translated is skipped."""
    from attn_mt.cli.job import Job, run_job
    from attn_mt.world import World

    for index, corpus in enumerate(corpora):
        output = folder.translation(index)
        count = f"{index + 1}/{len(corpora)}"
        if output.is_file():
            print(f"distill: corpus {count} already translated ({named(output)})", file=sys.stderr)
            continue
        resume = output.with_name(output.name + ".partial.json").is_file()
        print(
            f"distill: the teacher {'continues translating' if resume else 'translates'} corpus "
            f"{count} ({named(str(corpus.src))}) into {named(output)}",
            file=sys.stderr,
        )
        again = "the same distill command"
        job = Job(Path(str(corpus.src)), output, None, resume, World(), settings, again)
        run_job(translator, request, fields, job)
