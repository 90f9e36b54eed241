"""The model card (README.md) of a Hugging Face export: what the model is, how it was
trained, its validation scores, how to run it, its license and limitations. It leaves the
machine, so it names files, never the training machine's paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from attn_mt.config.data import DataConfig
from attn_mt.decode.translator import Translator
from attn_mt.export.common import license_note
from attn_mt.export.hf_parity import Parity
from attn_mt.scores import score


def _tag_usage(data: DataConfig) -> tuple[str, str]:
    """The example's source and the paragraph on target-language codes: a multilingual
    model's sources start with `>>xx<<` (Marian's convention, which the tokenizer turns into
    the `<2xx>` tag attn-mt trained on); a bilingual model's take none."""
    if not data.language_tags():
        return "your sentence here", ""
    targets = data.target_languages()
    paragraph = (
        f"\nIt translates into {', '.join(targets)}: start each source with the target "
        f"language's code, `>>{targets[0]}<<` for {targets[0]} (Marian's convention; the "
        "tokenizer turns it into the tag attn-mt trained on).\n"
    )
    return f">>{targets[0]}<< your sentence here", paragraph


def model_card(
    translator: Translator,
    checkpoint: Path,
    hf_model,
    out: Path,
    parity: Parity,
    license: str = "unknown",
) -> str:
    """README.md: what the model is, how it was trained, its scores, how to run it from `out`,
    its license and limitations. It leaves the machine: files are named, never the training
    machine's paths (`without_local_paths`)."""
    cfg, d = translator.config, translator.config.decode
    data = training_data_line(cfg.data)
    table = _scores_table(checkpoint, cfg.train.eval_beam)
    license_text = license_note(license)
    directions = cfg.data.in_words()
    sample, tags = _tag_usage(cfg.data)
    return f"""\
---
library_name: transformers
pipeline_tag: translation
language: [{", ".join(cfg.data.languages())}]
license: {license}
tags: [attn-mt, translation]
---
# {directions} translation model, trained with attn-mt

A {type(hf_model).__name__} exported by `attn-mt export --format hf` from `{checkpoint.name}`
(training data: {data}, {directions}). The export checked that
`generate()` gives attn-mt's greedy and beam outputs token for token on a fixed sample of
{parity.sentences} sources: {parity}.

{table}

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{out.name}")
model = AutoModelForSeq2SeqLM.from_pretrained("{out.name}")
batch = tokenizer(["{sample}"], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```
{tags}
generation_config.json: beam {d.beam}, length penalty {d.length_penalty} (transformers divides
by length ** penalty; attn-mt by ((5 + length) / 6) ** penalty, so long beam outputs may differ
unless the penalty is 0), at most {d.max_len_a} x source + {d.max_len_b} tokens in attn-mt,
one max_length for every sentence in transformers.

## License

{license_text}

## Limitations

- Trained only on {data}: text of another domain, register or language variety may be
  translated poorly, and the model's quality is what the scores above say, no more.
- It can produce fluent output that is wrong: omissions, additions and mistranslated names or
  numbers. Have a speaker check anything that matters.
- It translates one sentence at a time, {directions} only;
  a source longer than {d.max_input_len} tokens is cut there.
- It reproduces what its training data hold, biases included.

## The attn-mt config

```yaml
{yaml.safe_dump(without_local_paths(cfg.to_dict()), sort_keys=False).strip()}
```
"""


def _scores_table(checkpoint: Path, eval_beam: int) -> str:
    """The card's validation scores (from the run folder), with sacreBLEU's signatures."""
    scores = _validation_scores(checkpoint)
    if not scores:
        return "The run folder holds no validation scores for this checkpoint."
    signatures = score(["a"], ["a"])  # attn-mt's sacreBLEU settings, this sacrebleu's version
    return (
        f"| validation BLEU | chrF | sentences | step |\n|---|---|---|---|\n"
        f"| {scores['bleu']:.2f} | {scores['chrf']:.2f} | {scores.get('sentences', '?')} "
        f"| {scores['step']} |\n\nsacreBLEU signatures: BLEU `{signatures.signatures['bleu']}`, "
        f"chrF `{signatures.signatures['chrf']}` (attn-mt's validation, beam {eval_beam}, during "
        "training)."
    )


def without_local_paths(value: Any) -> Any:
    """`value` (a config as a dict) with every absolute path replaced by its file name: the
    card leaves the machine, the training machine's folders do not."""
    if isinstance(value, dict):
        return {key: without_local_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_local_paths(item) for item in value]
    if isinstance(value, str) and (value.startswith(("/", "~")) or value[1:3] == ":\\"):
        return Path(value).name
    return value


def training_data_line(data) -> str:
    """The training data in words: the named corpus, else each corpus's file names (and weight)."""
    if data.dataset:
        return data.dataset
    corpora = data.train if isinstance(data.train, list) else [data.train]
    if any(c.src is None for c in corpora):  # an imported model: no files of attn-mt's
        return "not recorded (a pretrained model imported with `attn-mt import`)"
    return "; ".join(
        f"{Path(c.src).name} / {Path(c.tgt).name}"
        + (f" (weight {c.weight:g})" if getattr(c, "weight", 1.0) != 1.0 else "")
        for c in corpora
    )


def _validation_scores(checkpoint: Path) -> dict | None:
    """The last validation record (BLEU, chrF) of the checkpoint's step in its run folder's
    metrics.jsonl, if any. The scores only annotate the model card, so a damaged log (a cut
    last line, bytes that are not UTF-8, a line that is not a JSON object) costs only its
    damaged lines, and an unreadable one its scores."""
    from attn_mt.checkpoint import load_checkpoint

    step = load_checkpoint(checkpoint)["step"]
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        metrics = folder / "metrics.jsonl"
        if metrics.is_file():
            try:
                lines = metrics.read_bytes().decode("utf-8", "replace").splitlines()
            except OSError:
                return None
            found = []
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:  # a cut or garbled line
                    continue
                if not isinstance(record, dict) or record.get("step") != step:
                    continue
                if all(isinstance(record.get(key), (int, float)) for key in ("bleu", "chrf")):
                    found.append(record)  # a validation record: the card formats both
            return found[-1] if found else None
    return None
