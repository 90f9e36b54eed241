"""`attn_mt.translate_file`: a file (or stdin) translated into a file (or stdout) as
`attn-mt translate` translates it, through the same `FileTranslation`: one output line per
input line, in input order; `shard` the I-th of N contiguous parts of the input; an `output`
file written through its resumable partial, which `resume=True` continues after an
interruption (with the same model, settings and input, or refused in one line); under
torchrun the lines shared among the processes and one output written in order.

The paths are checked first, before torch loads (`FileTranslation.check`); then the model is
loaded, the request checked against it and the job run (`FileTranslation.run`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_mt.decode.glossary import Glossary
from attn_mt.errors import UserError, named
from attn_mt.fileio import drop_stdout, os_reason, written_in_place
from attn_mt.jobs import io, split
from attn_mt.jobs.job import Job, LineFields, run_job
from attn_mt.jobs.nbest import NbestFormat
from attn_mt.jobs.pace import Progress, unseen
from attn_mt.jobs.partial import PartialOutput
from attn_mt.jobs.record import file_digest
from attn_mt.paths import Inputs, resolve_checkpoint
from attn_mt.world import World, world_from_env

if TYPE_CHECKING:  # torch: loaded by `run`, once the paths are known to be good
    from attn_mt.decode.request import Request
    from attn_mt.decode.search import Sampling
    from attn_mt.decode.translator import Translator

# The fields that say how `run` loads a model (`attn_mt.load`'s arguments): not for a Translator.
LOADING = ("device", "precision", "quantize", "prepack", "decode")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a job, which has said what it leaves (the lines written, or those kept
    for `resume`)."""


@dataclass
class FileTranslation:
    """A translation of `input` (a text or gzip file, a stream; None: stdin) into `output`
    (None: stdout) by `model`: a run folder or .pt file (several: an ensemble), loaded with
    `device`, `precision`, `quantize`, `prepack` and `decode` as `attn_mt.load` takes them, or
    a loaded `Translator`. The other fields are `attn-mt translate`'s options of the same
    names: the search (`beam`, `nbest`, `sampling`, `avoid`: words, or a file of them one a
    line, `glossary`: source -> target terms, or a file of `source<TAB>target` lines,
    `alignment`, `tgt_lang`), the lines (`prefix` and `constraints`: read after TABs;
    `nbest_format`; `split_sentences`: each line's sentences translated one by one, the
    default), which of them (`shard`: (I, N) or "I/N") and whether
    the partial of an interrupted `output` is continued (`resume`). `progress` is told how far
    the job is (`jobs/pace.py`)."""

    model: str | Path | Sequence[str | Path] | Translator
    input: str | Path | None = None
    output: str | Path | None = None
    beam: int | None = None
    nbest: int = 1
    nbest_format: NbestFormat | str = NbestFormat.tsv
    sampling: Sampling | None = None
    prefix: bool = False
    constraints: bool = False
    avoid: str | Path | Sequence[str] | None = None
    glossary: str | Path | Mapping[str, str] | None = None
    alignment: bool = False
    split_sentences: bool = True
    tgt_lang: str | None = None
    shard: str | tuple[int, int] | None = None
    resume: bool = False
    device: str = "auto"
    precision: str = "fp32"
    quantize: str | None = None
    prepack: bool | str = "auto"
    decode: dict[str, Any] | None = None
    progress: Progress = unseen

    def check(self) -> Job:
        """Every check that needs no torch, in the order `attn-mt translate` reports them (the
        models' paths, the shard, the input, the output, `resume`), and the job they allow."""
        checkpoints = [resolve_checkpoint(path) for path in self._paths()]
        source = None if self.input is None else Path(self.input)
        target = None if self.output is None else Path(self.output)
        shard = self.shard if isinstance(self.shard, str | None) else "/".join(map(str, self.shard))
        job = Job(source, target, split.parse_shard(shard), self.resume, world_from_env())
        io.check_input(source)
        if job.world.distributed and source is None:
            raise UserError(
                "translate under torchrun reads --input FILE (every process reads it; stdin "
                "reaches one of them)"
            )
        read: list[tuple[str, Path | None]] = [("--model", path) for path in checkpoints]
        read += [("--input", source) if source else ("stdin", io.stdin_path())]
        read += [("--avoid", Path(self.avoid) if isinstance(self.avoid, str | Path) else None)]
        read += [("--glossary", self._glossary_file())]
        io.check_output(target, read)
        if self.resume and (target is None or written_in_place(target)):
            raise UserError(
                "--resume continues an --output FILE (a regular file); a stream cannot be continued"
            )
        if target is not None and not written_in_place(target):
            job.complete = _whole(target, job.world, read) and self.resume
        if self._loaded() is not None:
            loading = [f for f in dataclasses.fields(self) if f.name in LOADING]
            if given := [f.name for f in loading if getattr(self, f.name) != f.default]:
                raise UserError(
                    f"{', '.join(given)}: how `attn_mt.load` loads a model; a loaded Translator "
                    "is used as it is"
                )
        return job

    def run(self, job: Job) -> None:
        """Load the model (unless given), check the request against it and run `job`, made by
        `check`: torch from here on. A Ctrl-C raises `Interrupted`, once the job has said what
        it leaves."""
        import attn_mt
        from attn_mt import distributed
        from attn_mt.decode.request import Request
        from attn_mt.precision import resolve_device

        glossary = self._glossary()  # a mistake in it: before the model loads
        if job.complete:
            print(
                f"attn-mt: --resume: {named(job.output or '')} is complete (no partial "
                "translation of it to continue); leave out --resume to translate it again",
                file=sys.stderr,
            )
            return
        loaded = self._loaded()
        device = loaded.device if loaded is not None else resolve_device(self.device)
        with distributed.process_group(device, split.WAIT) as (_, place):
            translator = (
                loaded
                if loaded is not None
                else attn_mt.load(
                    self._paths(),
                    device=str(place),
                    precision=self.precision,
                    quantize=self.quantize,
                    prepack=self.prepack,
                    decode=self.decode,
                )
            )
            translator.language_prefix(self.tgt_lang)  # a missing or unknown one: before input
            from attn_mt.documents.paragraphs import ParagraphTranslator

            # A line split into its sentences (or whole), as the server splits a paragraph.
            translator = ParagraphTranslator.splitting(translator, None, self.split_sentences)
            request = Request(
                beam=self.beam,  # None: the decode.beam, widened to `nbest`
                nbest=self.nbest,
                sampling=self.sampling,
                avoid=self._avoided(),
                glossary=glossary,
                alignment=self.alignment,
                tgt_lang=self.tgt_lang,
            )
            style = NbestFormat(self.nbest_format)
            fields = LineFields(self.nbest, style, self.prefix, self.constraints)
            if job.output is not None and not written_in_place(job.output):
                job.settings = record_settings(translator, request, fields)
                job.settings |= {"precision": self.precision, "quantize": self.quantize}
                job.settings |= {"split_sentences": self.split_sentences}
            try:
                run_job(translator, request, fields, job, self.progress)
            except KeyboardInterrupt:
                raise Interrupted from None
            except OSError as err:  # the reader went away (`| head`: end quietly), or a full disk
                gone = isinstance(err, BrokenPipeError)
                if job.output is not None and not gone:
                    raise  # --output's errors are its own
                drop_stdout()
                if not gone:
                    raise UserError(f"stdout: cannot write ({os_reason(err)})") from None

    def _loaded(self) -> Translator | None:
        """The Translator given as `model`; None where it names checkpoints."""
        return None if isinstance(self.model, str | os.PathLike | Sequence) else self.model

    def _paths(self) -> list[str | Path]:
        """The checkpoints `model` names, as given (a Translator's: those it was loaded from)."""
        if isinstance(self.model, str | os.PathLike):
            return [self.model]
        if isinstance(self.model, Sequence):
            return list(self.model)
        return list(self.model.checkpoints)

    def _glossary_file(self) -> Path | None:
        """The file `glossary` names, if it names one."""
        return Path(self.glossary) if isinstance(self.glossary, str | Path) else None

    def _glossary(self) -> Glossary | None:
        """The glossary: `glossary`'s terms, or its file's."""
        if isinstance(self.glossary, str | Path):
            return Glossary.read(Path(self.glossary))
        return None if self.glossary is None else Glossary.of(self.glossary)

    def _avoided(self) -> list[str]:
        """The words no output may hold: `avoid`'s, or its file's."""
        if isinstance(self.avoid, str | Path):
            return io.avoid_list(Path(self.avoid))
        return list(self.avoid or ())


def translate_file(
    model: str | Path | Sequence[str | Path] | Translator,
    input: str | Path | None = None,
    output: str | Path | None = None,
    **options: Any,
) -> None:
    """Translate `input` (None: stdin) into `output` (None: stdout) with `model` exactly as
    `attn-mt translate` does; `options` are `FileTranslation`'s other fields (`beam=`,
    `nbest=`, `shard=`, `resume=`, ...). Into a file, an interruption keeps the lines done:
    the same call with `resume=True` continues them and ends with the file an uncut run writes.

        import attn_mt
        attn_mt.translate_file("runs/multi30k_de_en", "big.de", "big.en", beam=5)
        attn_mt.translate_file("runs/multi30k_de_en", "big.de", "big.en", beam=5, resume=True)
        attn_mt.translate_file(translator, "big.de", "part3.en", shard=(3, 8))
    """
    translation = FileTranslation(model, input, output, **options)
    translation.run(translation.check())


def _whole(target: Path, world: World, inputs: Inputs) -> bool:
    """Whether the --output `target` is there with no partial translation of any process
    beside it; each partial checked first (`PartialOutput.check`: attn-mt's own, none of the
    `inputs`)."""
    real = Path(os.path.realpath(target))
    parts = [split.Lines(rank=rank, ranks=world.size).part_name for rank in range(world.size)]
    partials = [PartialOutput(real, part) for part in parts]
    for partial in partials:
        partial.check(inputs)
    return real.is_file() and not any(os.path.lexists(p.data) for p in partials)


def record_settings(translator: Translator, request: Request, fields: LineFields) -> dict[str, Any]:
    """What a partial translation's record keeps of how it was made, for `resume` to compare:
    the checkpoints' sha256, every decode.* setting but the batch size (which does not change
    a translation), the resolved request and how lines are read and written."""
    resolved = translator.resolve(request)
    decode = {k: v for k, v in asdict(translator.config.decode).items() if k != "batch_tokens"}
    wanted = ("beam", "nbest", "length_penalty", "sampling", "avoid", "alignment", "tgt_lang")
    return {
        "models": [file_digest(path) for path in translator.checkpoints],
        "decode": decode,
        "request": {name: _plain(getattr(resolved, name)) for name in (*wanted, "glossary")},
        "lines": {
            "nbest_format": fields.nbest_format.value,
            "prefix": fields.prefix,
            "constraints": fields.constraints,
        },
        "device": translator.device.type,
    }


def _plain(value: Any) -> Any:
    """A request's value as JSON keeps it (a Sampling as its fields, a tuple as a list, a
    glossary as its sha256)."""
    if isinstance(value, Glossary):
        return value.digest()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return list(value) if isinstance(value, tuple) else value
