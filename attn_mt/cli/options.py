"""The option types that several commands share, and the fixed sets their help lists.

Only names and help text live here: the values are checked by the library (`attn_mt.load`,
`export_ctranslate2`), so a notebook user meets the same rules as the command line.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import typer


class AttentionKind(str, enum.Enum):
    """Which attention `attn-mt attention` draws."""

    cross = "cross"
    encoder = "encoder"
    decoder = "decoder"


TgtLangOption = Annotated[
    str | None,
    typer.Option(
        "--tgt-lang",
        metavar="LANG",
        help="The language to translate into (a multilingual model needs it).",
    ),
]


class Split(str, enum.Enum):
    """A split of the run's corpus that `evaluate` can score."""

    valid = "valid"
    test = "test"


class ExportFormat(str, enum.Enum):
    """What `attn-mt export` writes."""

    ct2 = "ct2"  # a CTranslate2 model folder
    hf = "hf"  # a Hugging Face transformers folder (model, tokenizer, generation config, card)


class Precision(str, enum.Enum):
    """The number format of `translate` and `evaluate`."""

    fp32 = "fp32"
    bf16 = "bf16"  # autocast; on CPUs with native bf16 (AMX, AVX-512 BF16) and recent GPUs
    fp16 = "fp16"  # autocast, CUDA only
    auto = "auto"  # bf16 where the device runs it natively, else fp16 (CUDA) or fp32


ConfigSetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key, e.g. --set train.lr=5e-4 (repeatable).",
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        metavar="auto|cpu|cuda|cuda:N",
        help="Where to run (auto = CUDA when present).",
    ),
]
MODEL_HELP = "A run folder (uses checkpoints/best.pt) or a .pt checkpoint"


def model_option(more: str = ".") -> Any:
    """The `--model PATH` option (`-m`), its help `MODEL_HELP` followed by `more`."""
    return typer.Option("--model", "-m", metavar="PATH", help=MODEL_HELP + more)


ModelOption = Annotated[  # a list, so that a second --model is refused (`one_model`), not taken
    list[Path], model_option()
]
ModelsOption = Annotated[
    list[Path],
    model_option(
        "; give it more than once to decode with the ensemble (models of one vocabulary, "
        "log-probabilities averaged)."
    ),
]
PrecisionOption = Annotated[
    Precision,
    typer.Option(
        "--precision",
        metavar="fp32|bf16|fp16|auto",
        help="fp32; bf16 or fp16 autocast; auto = bf16 where the device runs it natively.",
    ),
]
QuantizeOption = Annotated[
    str | None,
    typer.Option(
        "--quantize",
        metavar="int8",
        help="int8: dynamically quantized linear layers (CPU only, fp32 otherwise).",
    ),
]


class Prepack(str, enum.Enum):
    """Whether float32 CPU decoding prepacks the linear layers for oneDNN (`attn_mt.load`)."""

    auto = "auto"  # where a product timed at load runs clearly faster packed
    on = "on"
    off = "off"

    @property
    def value_for_load(self) -> bool | str:
        choices: dict[str, bool | str] = {"auto": "auto", "on": True, "off": False}
        return choices[self.value]


PrepackOption = Annotated[
    Prepack,
    typer.Option(
        "--prepack",
        metavar="auto|on|off",
        help="float32 on the CPU: prepack the linear layers for oneDNN (auto = where a "
        "product timed at load runs clearly faster packed; off saves the kernels' memory).",
    ),
]
# The scores `evaluate` and `compare` print.
MetricsOption = Annotated[
    str,
    typer.Option(
        "--metrics",
        metavar="LIST",
        help="Comma-separated: bleu, chrf, chrf++, ter, comet (sacreBLEU's, each with its "
        "signature; comet with --comet-model).",
    ),
]
CometModelOption = Annotated[
    Path | None,
    typer.Option(
        "--comet-model",
        metavar="PATH",
        help="A COMET model on this machine (its folder or .ckpt; nothing is downloaded), for "
        "--metrics comet; needs pip install 'attn-mt[comet]'.",
    ),
]
# The search options `translate`, `evaluate` and `export` share: `decode_settings` turns them
# into the `decode=` overrides of `attn_mt.load`, which checks them as a config file.
BeamOption = Annotated[
    int | None,
    typer.Option(
        "--beam",
        "-b",
        metavar="N",
        help="Beam size (default: the checkpoint's decode.beam; 1 = greedy).",
    ),
]
LengthPenaltyOption = Annotated[
    float | None,
    typer.Option(
        "--length-penalty", metavar="ALPHA", help="GNMT alpha (default: the checkpoint's)."
    ),
]
DecodeSetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="decode.KEY=VALUE",
        help="Override a decode setting of the checkpoint, e.g. --set decode.max_len_a=2 "
        "(repeatable; any decode.* key, checked as in a config file).",
    ),
]


def one_model(models: list[Path], command: str, why: str) -> Path:
    """The one --model of a command that reads one (`why` says so); a second is refused."""
    from attn_mt.errors import UserError

    if len(models) > 1:
        raise UserError(
            f"{command}: --model given {len(models)} times; {why} (average checkpoints first "
            "with `attn-mt average`)"
        )
    return models[0]


def decode_settings(
    sets: list[str] | None, beam: int | None = None, length_penalty: float | None = None
) -> dict:
    """The `decode=` overrides of `attn_mt.load` from `--set decode.KEY=VALUE` items (parsed
    as a config file's `--set`), then `--beam` and `--length-penalty`."""
    from attn_mt.config.file import apply_override
    from attn_mt.errors import UserError

    raw: dict = {}
    for item in sets or []:
        if not item.strip().startswith("decode."):
            raise UserError(
                f"--set {item}: only decode.* keys can be set here, "
                "e.g. --set decode.length_penalty=0.6"
            )
        apply_override(raw, item)
    settings = raw.get("decode", {})
    if beam is not None:
        settings["beam"] = beam
    if length_penalty is not None:
        settings["length_penalty"] = length_penalty
    return settings
