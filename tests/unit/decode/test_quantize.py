"""Faster decoding without other output: beams reordered without copying what is equal across a
sentence's beams gives the same hypotheses as copying everything; int8 (`--quantize int8`)
stays within a stated BLEU of float32 on the trained toy model; bad combinations are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.models import assert_same, random_model, random_sources
from helpers.toy import invoke

import attn_mt
from attn_mt.data.text import read_lines
from attn_mt.decode.generate import StepDecoder, generate, max_output_lengths
from attn_mt.decode.packed import split_in_proj
from attn_mt.decode.search import Beam
from attn_mt.scores import score

INT8_BLEU_TOLERANCE = 2.0  # BLEU points below float32 that int8 may lose on the toy test set


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reordering_beams_only_in_the_self_attention_cache_changes_no_hypothesis(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search as it was (K rows per sentence of every cache, memory and mask, all
    reordered each step) and as it is (one shared row per sentence, only the self-attention
    caches reordered) find the same hypotheses with bit-equal scores."""
    model, src = random_model(seed), random_sources(seed)
    limits = max_output_lengths(src, 1.5, 5)
    fast = generate(model, src, limits, Beam(4, nbest=4), alpha=1.0)
    every_row = StepDecoder.select
    monkeypatch.setattr(StepDecoder, "reorder_beams", every_row)
    monkeypatch.setattr(
        StepDecoder, "select", lambda self, rows, sentences=None: every_row(self, rows)
    )
    slow = generate(model, src, limits, Beam(4, nbest=4), alpha=1.0)
    for a, b in zip(fast, slow, strict=True):
        assert_same(a, b, rel=0.0)


def test_int8_keeps_the_bleu_of_float32(trained_run: Path) -> None:
    fp32 = attn_mt.load(trained_run, device="cpu")
    int8 = attn_mt.load(trained_run, device="cpu", quantize="int8")
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    split = split_in_proj(attn_mt.load(trained_run, device="cpu", prepack=False).model)
    linear = [name for name, m in split.named_modules() if isinstance(m, torch.nn.Linear)]
    int8_linear = [name for name, m in int8.model.named_modules() if isinstance(m, Int8Linear)]
    assert int8_linear == linear and len(linear) == 17  # 6 + 10 + the output layer
    lines = read_lines(fp32.config.data.test.src)
    refs = read_lines(fp32.config.data.test.tgt)
    for beam in (1, 3):
        a, b = fp32.translate(lines, beam=beam), int8.translate(lines, beam=beam)
        assert len(b) == len(lines) and sum(x == y for x, y in zip(a, b, strict=True)) > len(a) / 2
        assert score(b, refs).bleu >= score(a, refs).bleu - INT8_BLEU_TOLERANCE
    # The float model the int8 one was made from is untouched.
    again = attn_mt.load(trained_run, device="cpu")
    for (name, p), q in zip(
        fp32.model.state_dict().items(), again.model.state_dict().values(), strict=True
    ):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quantize", "int8", "--precision", "bf16"], "exclude each other"),
        (["--precision", "fp16", "--device", "cpu"], "--precision fp16 needs a CUDA GPU"),
        (["--quantize", "int4"], "int4"),
    ],
)
def test_bad_number_formats_are_refused(trained_run: Path, args: list[str], message: str) -> None:
    result = invoke("translate", "--model", trained_run, "--device", "cpu", *args)
    assert result.exit_code != 0  # a UserError (one line from `main`) or typer's usage error
    assert message in f"{result.output}{result.exception}"


def test_int8_and_bf16_translate_from_the_command_line(trained_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("qb qc qd\n\nqz qf\n")
    for args in (["--quantize", "int8"], ["--precision", "bf16"]):
        out = tmp_path / f"{args[1]}.txt"
        result = invoke("translate", "--model", trained_run, "--device", "cpu", "--input", source,
                        "--output", out, *args)  # fmt: skip
        assert result.exit_code == 0, result.output
        lines = out.read_text().splitlines()
        assert len(lines) == 3 and lines[1] == "" and lines[0] and lines[2]
