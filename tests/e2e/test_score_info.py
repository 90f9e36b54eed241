"""`attn-mt score` (forced decoding) and `attn-mt info RUN`: the score is the model's own
log-probability, greedy search's output scores its own logprob, info shows the run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.clirun import assert_user_error, attn_mt
from helpers.toy import toy_pairs, write_lines
from helpers.workspace import World

import attn_mt as library
from attn_mt.checkpoint import load_checkpoint, model_from
from attn_mt.data.batching import source_batch
from attn_mt.decode.forced import score_ids
from attn_mt.decode.generate import generate
from attn_mt.decode.search import Greedy
from attn_mt.model.vocab import BOS_ID, EOS_ID


def best(world: World) -> Path:
    return world.run / "checkpoints" / "best.pt"


def direct_score(model: torch.nn.Module, src: list[int], tgt: list[int]) -> float:
    """log P(tgt, </s> | src) from one unbatched, unpadded model call."""
    with torch.no_grad():
        logits = model(torch.tensor([[*src, EOS_ID]]), torch.tensor([[BOS_ID, *tgt]]))
    log_probs = logits.float().log_softmax(-1)[0]  # (T+1, V)
    return sum(log_probs[t, token].item() for t, token in enumerate([*tgt, EOS_ID]))


def test_score_is_the_models_log_probability(world: World, tmp_path: Path) -> None:
    src, tgt = toy_pairs(7, seed=11)
    tgt[2] = tgt[4]  # a reference that is not the translation: a low score, still exact
    args = ["--src", write_lines(tmp_path / "s", src), "--ref", write_lines(tmp_path / "r", tgt)]
    common = ["score", "-m", best(world), *args, "--device", "cpu", "--batch-tokens", "16"]
    result = attn_mt(*common, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    translator = library.load(best(world), device="cpu", prepack=False)
    src_ids, tgt_ids = translator.src_tokenizer.encode(src), translator.tgt_tokenizer.encode(tgt)
    assert len(records) == len(src)
    for record, s, t in zip(records, src_ids, tgt_ids, strict=True):
        assert record["score"] == pytest.approx(direct_score(translator.model, s, t), abs=1e-4)
        assert record["score"] == pytest.approx(sum(record["tokens"]), abs=1e-9)
        assert len(record["tokens"]) == len(t) + 1 and record["pieces"][-1] == "</s>"
    assert records[2]["score"] < records[4]["score"]  # in input order
    plain = attn_mt(*common, "--normalize", cwd=tmp_path).stdout.decode().splitlines()
    total, tokens = plain[0].split("\t")
    assert float(total) == pytest.approx(records[0]["score"] / len(records[0]["tokens"]), 1e-4)
    assert len(tokens.split()) == len(records[0]["tokens"])


@pytest.mark.parametrize("seed", range(4))
def test_greedy_output_scores_its_own_logprob(world: World, seed: int) -> None:
    translator = library.load(best(world), device="cpu", prepack=False)
    src, _ = toy_pairs(9, seed=100 + seed)
    ids = translator.src_tokenizer.encode(src)
    batch = source_batch(ids, list(range(len(ids))))
    limits = torch.full((len(ids),), 40)
    with torch.no_grad():
        hyps = [best for [best] in generate(translator.models, batch, limits, Greedy())]
    scores = score_ids(translator.model, ids, [h.tokens for h in hyps], batch_tokens=24)
    for hyp, tokens in zip(hyps, scores, strict=True):
        assert sum(tokens) == pytest.approx(hyp.logprob, abs=1e-4)


def test_score_refuses_files_of_different_lengths(world: World, tmp_path: Path) -> None:
    src = write_lines(tmp_path / "s", ["1 2", "3 4"])
    ref = write_lines(tmp_path / "r", ["1 2"])
    result = attn_mt("score", "-m", best(world), "--src", src, "--ref", ref, cwd=tmp_path)
    assert_user_error(result, "has 2 lines but --ref", "has 1")


def test_info_shows_the_run(world: World, tmp_path: Path) -> None:
    result = attn_mt("info", world.run, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode()
    for fragment in ("languages: ", "parameters", "steps: ", "best: ", "checkpoint: best.pt"):
        assert fragment in out, out
    assert f"attn-mt train --resume {world.run}" in out
    one = attn_mt("info", best(world), cwd=tmp_path)
    assert one.returncode == 0 and "parameters" in one.stdout.decode(), one.stderr.decode()


def test_one_parameter_count_for_one_model(world: World, tmp_path: Path) -> None:
    """The training banner, `attn-mt info` and the server's /info (of a model whose linear
    layers are prepacked, as `serve` loads it) state one count: each tied tensor once."""
    banner = re.search(r"([\d,]+) parameters", (world.run / "train.log").read_text())
    shown = re.search(
        r"; ([\d,]+) parameters", attn_mt("info", world.run, cwd=tmp_path).stdout.decode()
    )
    served = library.load(best(world), device="cpu", prepack=True).describe()["parameters"]
    model, _ = model_from(load_checkpoint(best(world)))
    assert model.output.weight is model.tgt_embed.embedding.weight  # tied: counted once
    unique = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert banner and shown and banner[1] == shown[1] == f"{served:,}" == f"{unique:,}"


def test_info_maps_the_checkpoint_and_imports_no_compiler(world: World, tmp_path: Path) -> None:
    """`info` reads what last.pt says of itself with its tensors (the optimizer state too)
    memory-mapped, never read, and without torch._dynamo (seconds of start-up)."""
    child = f"""
import sys, torch
seen = []
load = torch.load
torch.load = lambda *args, **kwargs: seen.append(kwargs.get("mmap")) or load(*args, **kwargs)
from attn_mt.cli import main
sys.argv = ["attn-mt", "info", {str(world.run)!r}]
try:
    main()
except SystemExit as done:
    assert not done.code, done.code
print("loads", seen, "torch._dynamo" in sys.modules)
"""
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "loads [True] False", result.stdout


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda tmp: tmp / "nowhere", "no such run folder or checkpoint"),
        (lambda tmp: tmp, "not a run folder (no config.yaml)"),
        (lambda tmp: write_lines(tmp / "notes.txt", ["x"]), "not a run folder or a .pt"),
    ],
)
def test_info_errors_are_one_line(tmp_path: Path, make, fragment: str) -> None:
    assert_user_error(attn_mt("info", make(tmp_path), cwd=tmp_path), fragment)
