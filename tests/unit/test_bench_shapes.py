"""bench/shapes.py: a random-weight checkpoint of any shape decodes every sentence to the same
length rule, so that shapes compare by their decoding cost alone."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

import attn_mt
from attn_mt.checkpoint import load_checkpoint
from attn_mt.data.text import read_lines
from attn_mt.decode.generate import max_output_lengths
from attn_mt.model.vocab import EOS_ID
from bench.shapes import parse_shape, random_checkpoint

SHAPE = {"d_model": 32, "heads": 2, "encoder_layers": 2, "decoder_layers": 1, "d_ff": 48}


@pytest.mark.parametrize("beam", [1, 3])
def test_a_random_shape_decodes_every_sentence_to_its_source_length(
    trained_run: Path, tmp_path: Path, beam: int
) -> None:
    ckpt = random_checkpoint(load_checkpoint(trained_run), SHAPE, tmp_path / "shape.pt")
    translator = attn_mt.load(ckpt, device="cpu", prepack=False)
    trained = attn_mt.load(trained_run, device="cpu", prepack=False)
    model = translator.config.model
    assert {key: getattr(model, key) for key in SHAPE} == SHAPE
    assert translator.src_tokenizer.vocab_size == trained.src_tokenizer.vocab_size
    lines = read_lines(translator.config.data.test.src)
    outputs = [n[0] for n in translator.translate_nbest(lines, beam=beam)]
    limits = [
        int(max_output_lengths(torch.tensor([[*ids, EOS_ID]]), 1.0, 1)[0])  # as a batch has it
        for ids in translator.encode(lines, None)
    ]
    # no search stopped early: every output is its limit long (less the same <eos> offset)
    offsets = {limit - len(out.tokens) for limit, out in zip(limits, outputs, strict=True)}
    assert len(offsets) == 1 and offsets <= {0, 1}, offsets
    assert len(set(limits)) > 1  # the sentences differ in length, and so do the outputs


def test_a_shape_is_five_sizes_with_a_name() -> None:
    assert parse_shape("student=256,4,6,1,1024") == (
        "student",
        {"d_model": 256, "heads": 4, "encoder_layers": 6, "decoder_layers": 1, "d_ff": 1024},
    )
    for wrong in ("256,4,6,1,1024", "s=256,4,6,1", "s=256,4,six,1,1024", "=1,1,1,1,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shape(wrong)
