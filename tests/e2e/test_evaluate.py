"""`attn-mt evaluate` (sacreBLEU on the translated split or files) and `attn-mt average`."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from helpers.busy import beside_competitors

import attn_mt
from attn_mt.checkpoint import save_checkpoint, tokenizers_from
from attn_mt.config.file import config_from_dict
from attn_mt.data.text import read_lines
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.model.transformer import build_model

ATTN_MT = Path(sys.executable).parent / "attn-mt"


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """`attn-mt ARGS` on the CPU in a fresh process; never a traceback."""
    done = subprocess.run(
        [str(ATTN_MT), *map(str, args)], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@pytest.fixture
def run_copy(trained_run: Path, tmp_path: Path) -> Path:
    """A run folder holding a copy of the trained best.pt (evaluate writes beside it)."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copy(trained_run / "checkpoints" / "best.pt", folder / "best.pt")
    return tmp_path / "run"


# ---------------------------------------------------------------------------------------------
# evaluate


def test_json_bleu_is_sacrebleu_of_the_written_hypotheses(run_copy: Path) -> None:
    done = run_cli("evaluate", "--model", run_copy, "--split", "test", "--json", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    hyp_file = run_copy / "checkpoints" / "best.test.beam3.hyp.txt"
    assert Path(result["hypotheses"]) == hyp_file
    translator = attn_mt.load(run_copy, device="cpu")
    sources = read_lines(translator.config.data.test.src)
    references = read_lines(translator.config.data.test.tgt)
    hypotheses = read_lines(hyp_file)
    assert hypotheses == translator.translate(sources)
    assert result["sentences"] == len(references) == 100
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert result["bleu"] > 80
    assert result["beam"] == translator.config.decode.beam


def test_src_ref_files_and_out(run_copy: Path, toy_data: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "hyps" / "valid.txt"
    out.parent.mkdir()
    src, ref = toy_data["valid.src"], toy_data["valid.tgt"]
    done = run_cli(
        "evaluate", "--model", run_copy / "checkpoints" / "best.pt", "--src", src, "--ref", ref,
        "--out", out, "--beam", "2", "--json", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    hypotheses, references = read_lines(out), read_lines(ref)
    assert len(hypotheses) == len(references) == result["sentences"]
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert result["beam"] == 2
    assert not list((run_copy / "checkpoints").glob("*.txt"))  # --out replaces the default


def test_text_mode_prints_the_signatures(run_copy: Path) -> None:
    done = run_cli("evaluate", "--model", run_copy, "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BLEU ")
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    hypotheses = read_lines(run_copy / "checkpoints" / "best.test.beam3.hyp.txt")
    references = read_lines(attn_mt.load(run_copy, device="cpu").config.data.test.tgt)
    assert f"BLEU {bleu.corpus_score(hypotheses, [references]).score:.2f}" in done.stdout
    assert f"chrF {chrf.corpus_score(hypotheses, [references]).score:.2f}" in done.stdout
    assert f"BLEU signature: {bleu.get_signature()}" in done.stdout.splitlines()
    assert f"chrF signature: {chrf.get_signature()}" in done.stdout.splitlines()
    assert "hypotheses:" in done.stderr


def test_search_options_as_translate_and_one_file_per_beam(run_copy: Path) -> None:
    """evaluate takes translate's search options; each beam writes its own file."""
    from typer.testing import CliRunner

    from attn_mt.cli import app

    translator = attn_mt.load(run_copy, device="cpu")
    sources = read_lines(translator.config.data.valid.src)
    folder = run_copy / "checkpoints"
    for options in (["--beam", "1"], ["--length-penalty", "0", "--set", "decode.max_len_a=2"]):
        result = CliRunner().invoke(
            app, ["evaluate", "--model", str(run_copy), "--split", "valid", "--json", *options]
        )
        assert result.exit_code == 0, result.output
    beam1, beam3 = folder / "best.valid.beam1.hyp.txt", folder / "best.valid.beam3.hyp.txt"
    assert read_lines(beam1) == translator.translate(sources, beam=1)
    translator.config.decode.max_len_a = 2.0
    assert read_lines(beam3) == translator.translate(sources, beam=3, length_penalty=0.0)
    result = CliRunner().invoke(
        app, ["evaluate", "--model", str(run_copy), "--set", "decode.beam=0"]
    )
    assert "decode.beam: 0 is invalid" in str(result.exception)


def test_evaluate_split_is_what_the_command_prints(run_copy: Path, tmp_path: Path) -> None:
    """`evaluate_split` (the library) writes and scores what `attn-mt evaluate --json` does."""
    from attn_mt.errors import UserError
    from attn_mt.evaluate import TestChoice, evaluate_split

    translator = attn_mt.load(run_copy, device="cpu", decode={"beam": 2})
    done: list[int] = []

    @contextlib.contextmanager
    def progress(total: int):
        yield done.append
        assert sum(done) == total

    result = evaluate_split(translator, split="valid", progress=progress)
    assert result.hypotheses == run_copy / "checkpoints" / "best.valid.beam2.hyp.txt"
    assert result.beam == 2 and sum(done) == result.scores.sentences
    cli = run_cli("evaluate", "--model", run_copy, "--split", "valid", "--beam", "2", "--json",
                  "--device", "cpu", "--out", tmp_path / "cli.txt")  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    printed = json.loads(cli.stdout)
    assert read_lines(tmp_path / "cli.txt") == read_lines(result.hypotheses)
    assert printed == {**result.to_dict(), "hypotheses": str(tmp_path / "cli.txt")}
    with pytest.raises(UserError, match="give both --src and --ref"):
        evaluate_split(translator, src=tmp_path / "cli.txt")
    with pytest.raises(TypeError, match="give a TestChoice or its fields"):
        evaluate_split(translator, "valid")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        evaluate_split(translator, TestChoice(split="valid"), split="test")
    with pytest.raises(UserError, match="either --split or --src/--ref"):
        evaluate_split(translator, split="test", src=tmp_path / "cli.txt", ref=tmp_path / "cli.txt")


def test_evaluate_sizes_torchs_threads_to_the_free_cores(run_copy: Path) -> None:
    """Beside a competitor on two cores each batch of `evaluate` searches on one thread, and the
    hypotheses are those of two threads."""
    from attn_mt.evaluate import evaluate_split

    translator = attn_mt.load(run_copy, device="cpu", decode={"beam": 2, "batch_tokens": 300})
    with beside_competitors(0) as idle:
        alone = read_lines(evaluate_split(translator, split="valid").hypotheses)
    with beside_competitors(1) as busy:
        beside = read_lines(evaluate_split(translator, split="valid").hypotheses)
    assert beside == alone
    assert len(busy) >= 2 and set(busy) == {1} and set(idle) == {2}, (busy, idle)


# ---------------------------------------------------------------------------------------------
# average


def test_averaging_a_checkpoint_with_itself_is_the_identity(trained_run: Path, tmp_path) -> None:
    best, out = trained_run / "checkpoints" / "best.pt", tmp_path / "avg.pt"
    done = run_cli("average", "--out", out, best, best)
    assert done.returncode == 0, done.stderr
    original, averaged = load_tensors(best), load_tensors(out)
    assert original.keys() == averaged.keys()
    for name, tensor in original.items():
        assert torch.equal(averaged[name], tensor), name


def test_averaging_two_checkpoints_is_the_mean(trained_run: Path, tmp_path: Path) -> None:
    first, second = sorted((trained_run / "checkpoints").glob("step_*.pt"))[:2]
    out = tmp_path / "avg.pt"
    done = run_cli("average", "--out", out, first, second)
    assert done.returncode == 0, done.stderr
    a, b, averaged = load_tensors(first), load_tensors(second), load_tensors(out)
    assert not torch.equal(a["output.weight"], b["output.weight"])
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, msg=name)
    lines = ["qb qc qd", "", "qz qf"]
    assert len(attn_mt.load(out, device="cpu").translate(lines)) == 3


def other_checkpoint(best: Path, key: str, value: int, out: Path, toy_data) -> Path:
    """`best` with config `key` (model.* or tokenizer.vocab_size) set to `value`, fresh weights."""
    state = torch.load(best, weights_only=True)
    section, name = key.split(".")
    state["config"][section][name] = value
    cfg = config_from_dict(state["config"])
    if section == "tokenizer":
        lines = read_lines(toy_data["train.src"]) + read_lines(toy_data["train.tgt"])
        tokenizer = train_tokenizer(cfg.tokenizer, lines, out.parent / "spm")
        state["tokenizers"] = {"src": tokenizer.model_bytes, "tgt": tokenizer.model_bytes}
    src_tok, tgt_tok = tokenizers_from(state)
    state["model"] = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size).state_dict()
    save_checkpoint(state, out)
    return out


@pytest.mark.parametrize(("key", "value"), [("model.d_ff", 96), ("tokenizer.vocab_size", 50)])
def test_averaging_checkpoints_of_different_configs_is_refused(
    trained_run: Path, toy_data: dict[str, Path], tmp_path: Path, key: str, value: int
) -> None:
    best = trained_run / "checkpoints" / "best.pt"
    other = other_checkpoint(best, key, value, tmp_path / "other.pt", toy_data)
    done = run_cli("average", "--out", tmp_path / "avg.pt", best, other)
    assert done.returncode == 2
    assert done.stderr.startswith("attn-mt: error: ") and len(done.stderr.splitlines()) == 1
    assert f"keys differ: {key}" in done.stderr
    assert not (tmp_path / "avg.pt").exists()
