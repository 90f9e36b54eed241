"""A distillation's run, as `attn-mt distill` makes it (and a notebook may): every check first
(the options, the teachers' paths, the student config, the run folder; then, once torch loads
them, the teachers' direction: `start_distillation`), then the teacher (or the ensemble of
teachers) translates each training corpus's sources into `OUT_DIR/distilled/corpusK.nbest`
through the resumable translation job (`jobs/job.py`): a distillation stopped at any moment
and started again with the same arguments continues where it stopped. `distill/corpus.py`
assembles the student's corpus from them (`Distillation.translate`), and the student trains
through `start_run` on `distilled/student.yaml`: the student config with `data.train`
replaced by that corpus (`Distillation.train`).

    run = start_distillation(["runs/multi30k_de_en"], "configs/multi30k_de_en_student.yaml")
    run.translate()
    run.train()
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.config.file import config_from_dict, load_config
from attn_mt.distill.corpus import (
    DistilledFolder,
    DistillOptions,
    assemble,
    check_teacher,
    student_corpora,
    student_pair,
)
from attn_mt.errors import UserError, named
from attn_mt.fileio import atomic_write, os_reason
from attn_mt.jobs.job import Job, LineFields, run_job
from attn_mt.jobs.nbest import NbestFormat
from attn_mt.jobs.pace import Progress, unseen
from attn_mt.jobs.partial import PartialOutput
from attn_mt.jobs.record import difference
from attn_mt.jobs.translate import record_settings
from attn_mt.paths import check_output_dir, resolve_checkpoint
from attn_mt.runfolder import RUN_ENTRIES, busy, check_run_start, holder, lock_run_folder
from attn_mt.train.run import start_run
from attn_mt.world import World, world_from_env

if TYPE_CHECKING:  # torch: loaded once every check that needs none has passed
    from attn_mt.config.data import TrainCorpus
    from attn_mt.config.schema import Config
    from attn_mt.decode.request import Request
    from attn_mt.decode.translator import Translator
    from attn_mt.train.loop import TrainResult
    from attn_mt.train.runlog import Monitor


@dataclass
class Distillation:
    """A distillation checked and its folder claimed: the teacher and its search, the corpora
    it translates, where, and whether the student's training continues a run."""

    teacher: Translator | None  # let go before the student trains
    request: Request
    fields: LineFields
    settings: dict[str, Any]  # the distilled folder's record
    options: DistillOptions
    corpora: list[TrainCorpus]
    folder: DistilledFolder
    resume: bool
    device: str

    def translate(self, progress: Progress = unseen) -> None:
        """Each corpus's sources into the teacher's n-best file, continued where a partial
        translation was left (a corpus already translated is skipped), then the student's
        corpus assembled from them; nothing once that corpus is written."""
        if self.folder.assembled():
            return
        assert self.teacher is not None, "translate() before train()"
        with lock_run_folder(self.folder.root.parent, "distill"):  # a second distill waits
            for index, corpus in enumerate(self.corpora):
                self._translate(index, corpus, progress)
            try:
                summary = assemble(self.corpora, self.folder, self.options).summary()
            except OSError as err:  # a full disk, a file-size limit
                name = named(err.filename or self.folder.root)
                raise UserError(
                    f"{name}: cannot write ({os_reason(err)}); the teacher's translations are "
                    "kept: the same distill command writes the student's corpus from them"
                ) from None
        print(f"distill: {summary}", file=sys.stderr)

    def _translate(self, index: int, corpus: TrainCorpus, progress: Progress) -> None:
        """The teacher's n-best of corpus `index` (continued, if a run began it)."""
        assert self.teacher is not None
        output = self.folder.translation(index)
        count = f"{index + 1}/{len(self.corpora)}"
        if output.is_file():
            print(f"distill: corpus {count} already translated ({named(output)})", file=sys.stderr)
            return
        resume = PartialOutput(output).record_path.is_file()
        print(
            f"distill: the teacher {'continues translating' if resume else 'translates'} "
            f"corpus {count} ({named(str(corpus.src))}) into {named(output)}",
            file=sys.stderr,
        )
        again = "the same distill command"
        source = Path(str(corpus.src))
        job = Job(source, output, None, resume, World(), self.settings, again)
        run_job(self.teacher, self.request, self.fields, job, progress)

    def train(self, monitor: Monitor | None = None) -> TrainResult:
        """Train the student on the distilled corpus (its run continued, if it has begun),
        the teacher let go first; `monitor` follows the training (`start_run`)."""
        self.teacher = None
        print(f"distill: training the student on {named(self.folder.corpus[1])}", file=sys.stderr)
        cfg = load_config(self.folder.root / "student.yaml", [])
        return start_run(cfg, resume=self.resume, device=self.device, monitor=monitor)


def start_distillation(
    teachers: Sequence[str | Path],
    config: str | Path,
    sets: Sequence[str] = (),
    *,
    beam: int | None = None,
    keep_original: float = 0.0,
    drop_worst: float = 0.0,
    nbest_chrf: int = 0,
    device: str = "auto",
) -> Distillation:
    """The distillation of the student `config` (with `--set` overrides `sets`) from
    `teachers` (run folders or .pt files; several: an ensemble), every check made, the teacher
    loaded and the distilled folder claimed (its record and `student.yaml` written). The
    options are `attn-mt distill`'s (`DistillOptions`)."""
    cfg = load_config(config, list(sets))
    options = DistillOptions(beam, keep_original, drop_worst, nbest_chrf, cfg.train.seed)
    options.check()
    try:
        checkpoints = [resolve_checkpoint(path) for path in teachers]
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
    _check_outside_teachers(Path(cfg.train.out_dir), teachers, checkpoints)
    resume = _check_run_folder(cfg, folder)
    for index, corpus in enumerate(corpora):  # attn-mt's own partial translations, or none
        PartialOutput(folder.translation(index)).check([("data.train", Path(str(corpus.src)))])
    student = _student_config(cfg, folder)
    teacher, request = _teachers(checkpoints, str(teachers[0]), device, options, pair)
    fields = LineFields(options.nbest, NbestFormat.marian, prefix=False, constraints=False)
    settings = record_settings(teacher, request, fields)
    settings |= {"distill": options.record(), "corpora": [c.src for c in corpora]}
    _claim(folder, settings, student)
    return Distillation(
        teacher, request, fields, settings, options, corpora, folder, resume, device
    )


def _check_outside_teachers(
    out: Path, teachers: Sequence[str | Path], checkpoints: list[Path]
) -> None:
    """The student's run folder may not be a teacher's run folder or lie inside one: it would
    write its checkpoints among the teacher's (`--model TEACHER/checkpoints` would then mean
    the student)."""
    inside = Path(os.path.realpath(out))
    for given, checkpoint in zip(teachers, checkpoints, strict=True):
        run = _run_folder(Path(os.path.realpath(checkpoint)))
        if run is not None and (inside == run or run in inside.parents):
            raise UserError(
                f"train.out_dir {named(out)}: {'is' if inside == run else 'lies inside'} the "
                f"run folder of the teacher {named(str(given))} ({named(run)}); give the "
                "student a train.out_dir of its own, outside it"
            )


def _run_folder(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint file belongs to: RUN of RUN/checkpoints/NAME.pt, or the
    folder beside a run's config.yaml; None for a checkpoint on its own."""
    folder = checkpoint.parent
    if folder.name == "checkpoints":
        return folder.parent
    return folder if (folder / "config.yaml").is_file() else None


def _check_run_folder(cfg: Config, folder: DistilledFolder) -> bool:
    """The student's run folder, checked before any translation: whether its training is
    resumed (a distill's run that has begun), a run of something else refused."""
    out = Path(cfg.train.out_dir)
    resume = (out / "checkpoints" / "last.pt").is_file()
    if resume and not folder.assembled():
        raise UserError(
            f"{out}: already holds a run not trained by distill (no distilled corpus in it); "
            "choose another train.out_dir"
        )
    if (who := holder(out)) is not None:
        raise busy(out, who)
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
    raw = cfg.to_dict()
    src, tgt = folder.corpus
    raw["data"]["train"] = {"src": str(src), "tgt": str(tgt)}
    raw["train"]["out_dir"] = str(Path(cfg.train.out_dir).absolute())
    config_from_dict(raw)
    return raw


def _teachers(
    checkpoints: list[Path], name: str, device: str, options: DistillOptions, pair: str
) -> tuple[Translator, Request]:
    """The teacher (an ensemble for several; `name` the first as given), refused if it does
    not translate `pair`, and the search request of its n-best."""
    from attn_mt.decode.load import load
    from attn_mt.decode.request import Request
    from attn_mt.precision import resolve_device

    place = str(resolve_device(device))
    decode = {} if options.beam is None else {"beam": options.beam}
    translator = load(checkpoints, device=place, decode=decode)
    tgt_lang = check_teacher(translator.config.data, pair, name)
    return translator, Request(beam=options.beam, nbest=options.nbest, tgt_lang=tgt_lang)


def _claim(folder: DistilledFolder, settings: dict[str, Any], student: dict[str, Any]) -> None:
    """The distilled folder, its record and `student.yaml`. The record is written on the first
    run; a later run must have the same teachers, decode settings, options and corpora, or it
    would mix two teachers' work."""
    import yaml

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
