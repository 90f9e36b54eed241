"""Corpus scores of detokenized text: sacreBLEU's BLEU, chrF, chrF++ and TER (and COMET from a
local checkpoint, `attn_mt.comet`), each with the signature that makes it reproducible.

The one scorer of validation (`train/`), the exports' model card (`decode/`), `evaluate` and
`compare`. A low module: sacreBLEU is imported when a score is asked for, not with the module,
so that the config can name the metrics before anything heavy loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attn_mt.errors import UserError

if TYPE_CHECKING:
    from sacrebleu.metrics.base import Metric


@dataclass(frozen=True)
class MetricInfo:
    """What a metric is called where it is printed, and which way is better."""

    label: str
    higher_is_better: bool = True


# The metrics by the names `--metrics`, `train.valid_metrics` and the JSON use, in the order
# they are printed. chrF++ is chrF with word unigrams and bigrams (sacreBLEU's word_order=2);
# TER counts edits, so lower is better; COMET (x 100) needs a model and the sources.
METRICS = {
    "bleu": MetricInfo("BLEU"),
    "chrf": MetricInfo("chrF"),
    "chrf++": MetricInfo("chrF++"),
    "ter": MetricInfo("TER", higher_is_better=False),
    "comet": MetricInfo("COMET"),
}
DEFAULT_METRICS = ("bleu", "chrf")
STRING_METRICS = ("bleu", "chrf", "chrf++", "ter")  # the ones the text alone decides


def parse_metrics(text: str, option: str = "--metrics") -> tuple[str, ...]:
    """`"bleu,chrf++"` -> ("bleu", "chrf++"): known names, each once, in the order given."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if not names:
        raise UserError(f"{option}: name at least one metric ({', '.join(METRICS)})")
    for name in names:
        if name not in METRICS:
            raise UserError(f"{option} {text}: unknown metric {name!r}; use {', '.join(METRICS)}")
    return tuple(dict.fromkeys(names))


def check_metrics(metrics: Sequence[str], comet_model: Path | None) -> None:
    """COMET needs its model (given, and unbabel-comet installed); a model needs COMET."""
    if "comet" in metrics:
        from attn_mt.comet import check_comet

        check_comet(comet_model)
    elif comet_model is not None:
        raise UserError("--comet-model is read by --metrics comet only; add comet to --metrics")


def build_metrics(
    metrics: Sequence[str],
    references: Sequence[str],
    sources: Sequence[str] | None = None,
    comet_model: Path | None = None,
) -> dict[str, Metric]:
    """sacreBLEU `Metric` objects by name, the references read once into each one's cache
    (what sacreBLEU's command line builds); COMET, loaded from `comet_model`, reads `sources`."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    refs = [list(references)]
    built: dict[str, Metric] = {}
    for name in metrics:
        if name == "comet":
            from attn_mt.comet import Comet, load_comet

            if sources is None or comet_model is None:
                raise UserError("COMET reads the sources: give --src (and --comet-model)")
            built[name] = Comet(load_comet(comet_model), comet_model.name, sources, references)
        else:
            build = {"bleu": BLEU, "chrf": CHRF, "ter": TER}.get(name)
            built[name] = build(references=refs) if build else CHRF(word_order=2, references=refs)
    return built


@dataclass
class Scores:
    """Corpus-level figures by metric name and the signatures that make them reproducible."""

    values: dict[str, float]
    signatures: dict[str, str]
    sentences: int

    @property
    def bleu(self) -> float:
        return self.values["bleu"]

    @property
    def chrf(self) -> float:
        return self.values["chrf"]

    def to_dict(self) -> dict:
        """Plain dict, for `--json` and metrics.jsonl: `bleu`, ..., `bleu_signature`, ...,
        `sentences`."""
        signatures = {f"{name}_signature": text for name, text in self.signatures.items()}
        return {**self.values, **signatures, "sentences": self.sentences}

    def __str__(self) -> str:
        return "\n".join(
            [f"{figures_line(self.values)}  ({self.sentences} sentences)"]
            + [f"{METRICS[name].label} signature: {sig}" for name, sig in self.signatures.items()]
        )


def figures_line(values: dict[str, float]) -> str:
    """`BLEU 34.12  chrF 60.05`: the metrics among `values`, in the order of METRICS."""
    return "  ".join(
        f"{info.label} {values[name]:.2f}" for name, info in METRICS.items() if name in values
    )


def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    metrics: Sequence[str] = DEFAULT_METRICS,
    sources: Sequence[str] | None = None,
    comet_model: Path | None = None,
) -> Scores:
    """The corpus scores of detokenized hypotheses against one reference each: sacreBLEU's
    defaults (BLEU: 13a tokenizer, cased; chrF: 6 character orders, beta 2), COMET from the
    local `comet_model` reading `sources` too."""
    if len(hypotheses) != len(references):
        raise UserError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; they must align"
        )
    if not hypotheses:
        raise UserError("no hypotheses: there is nothing to score")
    built = build_metrics(metrics, references, sources, comet_model)
    values = {
        name: metric.corpus_score(list(hypotheses), None).score for name, metric in built.items()
    }
    signatures = {name: str(metric.get_signature()) for name, metric in built.items()}
    return Scores(values, signatures, len(hypotheses))
