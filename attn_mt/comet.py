"""COMET (Rei et al., 2020) from a checkpoint on this machine, as a sacreBLEU metric.

Optional: `pip install 'attn-mt[comet]'` (unbabel-comet) and a downloaded model (e.g.
`huggingface-cli download Unbabel/wmt22-comet-da`); nothing is downloaded at run time. A
segment's statistics are (its COMET score, 1), so the sum over any sample of segments is
(total, count) and the corpus score is their mean: sacreBLEU's paired tests resample COMET as
they resample BLEU's n-gram counts. Scores are COMET's x 100, printed as the other metrics are.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics.base import Metric, Score, Signature

from attn_mt.errors import UserError, named, one_line

INSTALL = "pip install 'attn-mt[comet]'"
DOWNLOAD = "e.g. the folder `huggingface-cli download Unbabel/wmt22-comet-da` prints"


def checkpoint_file(path: Path) -> Path:
    """A downloaded COMET model's folder means its checkpoints/model.ckpt; a file is itself."""
    return path / "checkpoints" / "model.ckpt" if path.is_dir() else path


def check_comet(path: Path | None) -> None:
    """A COMET checkpoint is given and on disk, and unbabel-comet is installed: checked before
    anything is translated."""
    if path is None:
        raise UserError(
            "--metrics comet needs --comet-model PATH, a COMET model on this machine (attn-mt "
            f"downloads nothing; {DOWNLOAD})"
        )
    if not checkpoint_file(path).is_file():
        raise UserError(
            f"--comet-model {named(path)}: no COMET checkpoint there; give a model's folder "
            f"(holding checkpoints/model.ckpt) or its .ckpt file ({DOWNLOAD})"
        )
    if importlib.util.find_spec("comet") is None:
        raise UserError(f"--metrics comet needs unbabel-comet: {INSTALL}")


def load_comet(path: Path) -> Any:
    """The COMET model of the checkpoint at `path`, from local files only (its encoder's
    tokenizer too: Hugging Face's hub is held offline)."""
    check_comet(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from comet import load_from_checkpoint
    except ImportError as err:  # a `comet` that is not unbabel-comet's, or a broken install
        raise UserError(
            f"--metrics comet: cannot import unbabel-comet ({err}); {INSTALL}"
        ) from None
    try:
        return load_from_checkpoint(str(checkpoint_file(path)), local_files_only=True)
    except Exception as err:  # COMET raises bare Exceptions for a damaged or partial model
        raise UserError(
            f"--comet-model {named(path)}: COMET cannot load it ({one_line(str(err))}); give "
            "the model's folder as downloaded (hparams.yaml, checkpoints/model.ckpt), with its "
            "encoder's tokenizer in the Hugging Face cache"
        ) from None


class CometSignature(Signature):
    """sacreBLEU's signature with the COMET model's name, the scale and COMET's version."""

    def __init__(self, args: dict):
        super().__init__(args)
        self._abbr.update({"model": "m", "scale": "x", "comet": "c"})
        self.info.update(
            {"model": args["model_name"], "scale": 100, "comet": args["comet_version"]}
        )


class Comet(Metric):
    """COMET of hypotheses against their sources and references, as a sacreBLEU `Metric`."""

    _SIGNATURE_TYPE = CometSignature

    def __init__(
        self, model: Any, model_name: str, sources: Sequence[str], references: Sequence[str]
    ):
        super().__init__()
        self.model, self.model_name = model, model_name
        self.sources, self.references = list(sources), list(references)
        self.num_refs = 1
        comet = importlib.import_module("comet")
        self.comet_version = getattr(comet, "__version__", "unknown")

    def _extract_corpus_statistics(
        self, hypotheses: Sequence[str], references: Sequence[Sequence[str]] | None
    ) -> list[list[float]]:
        """(score, 1) per segment, the model run once over the corpus."""
        samples = [
            {"src": src, "mt": hyp, "ref": ref}
            for src, hyp, ref in zip(self.sources, hypotheses, self.references, strict=True)
        ]
        import torch

        gpus = 1 if torch.cuda.is_available() else 0
        found = self.model.predict(samples, batch_size=16, gpus=gpus, progress_bar=False)
        return [[float(value), 1.0] for value in found.scores]

    def _compute_score_from_stats(self, stats: Sequence[float]) -> Score:
        total, count = stats
        return Score("COMET", 100 * float(total) / float(count))

    def _aggregate_and_compute(self, stats: Sequence[Sequence[float]]) -> Score:
        return self._compute_score_from_stats([sum(column) for column in zip(*stats, strict=True)])

    # sacreBLEU's per-segment hooks: COMET scores the corpus in one call instead (above).
    def _preprocess_segment(self, sent: str) -> str:
        raise NotImplementedError("COMET scores a corpus at once")

    def _extract_reference_info(self, refs: Sequence[str]) -> dict[str, Any]:
        raise NotImplementedError("COMET scores a corpus at once")

    def _compute_segment_statistics(self, hypothesis: str, ref_kwargs: dict) -> list[Any]:
        raise NotImplementedError("COMET scores a corpus at once")
