"""`attn-mt compare` and `attn-mt evaluate --metrics` on the command line: run folders and
checkpoints as systems (translated with their own decode settings, or --beam), the scores
equal to sacreBLEU's on the written hypotheses, and COMET through a stand-in `comet` package
(unbabel-comet's `load_from_checkpoint` and `predict`), so its code path runs without weights."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from helpers.toy import write_lines
from helpers.workspace import World, run_cli

import attn_mt
from attn_mt.data.text import read_lines

# The stand-in: a segment scores the share of reference words its hypothesis holds.
FAKE_COMET = """
__version__ = "0.0-test"


class Prediction:
    def __init__(self, scores):
        self.scores = scores


class Model:
    def predict(self, samples, batch_size, gpus, progress_bar):
        assert not progress_bar and {"src", "mt", "ref"} == set(samples[0])
        return Prediction([share(s["mt"], s["ref"]) for s in samples])


def share(hyp, ref):
    return len(set(hyp.split()) & set(ref.split())) / max(len(ref.split()), 1)


def load_from_checkpoint(path, local_files_only):
    assert local_files_only and path.endswith("model.ckpt"), path
    return Model()
"""


def ok(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """`attn-mt ARGS` in this process; it must succeed."""
    done = run_cli(list(args), None, {})
    assert done.returncode == 0, done.stderr.decode()
    return done


@contextlib.contextmanager
def comet_package(folder: Path, source: str) -> Iterator[Path]:
    """A `comet` package of `source` on sys.path while the block runs, and a COMET model
    folder (checkpoints/model.ckpt); later tests find no unbabel-comet, as installed here."""
    (folder / "site" / "comet").mkdir(parents=True)
    (folder / "site" / "comet" / "__init__.py").write_text(source)
    model = folder / "wmt-test-comet"
    (model / "checkpoints").mkdir(parents=True)
    (model / "checkpoints" / "model.ckpt").write_bytes(b"")
    assert "comet" not in sys.modules
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder / "site"))
        try:
            yield model
        finally:
            sys.modules.pop("comet", None)


@pytest.fixture
def fake_comet(tmp_path: Path) -> Iterator[Path]:
    with comet_package(tmp_path, FAKE_COMET) as model:
        yield model


def test_run_folders_and_checkpoints_are_systems(world: World, tmp_path: Path) -> None:
    """A run folder translates --src with its own decode settings (beam 2), a .pt with --beam:
    each scores as the file of that translation does."""
    src, ref = world.corpus["valid.src"], world.corpus["valid.tgt"]
    sources = read_lines(src)
    translator = attn_mt.load(world.run, device="cpu")
    own = write_lines(tmp_path / "own.txt", translator.translate(sources))
    greedy = write_lines(tmp_path / "greedy.txt", translator.translate(sources, beam=1))
    done = ok("compare", "--ref", ref, own, world.run, "--src", src, "--json", "--device", "cpu")
    systems = json.loads(done.stdout)["systems"]
    assert [s["name"] for s in systems] == [str(own), str(world.run)]
    assert systems[1]["metrics"]["bleu"]["score"] == systems[0]["metrics"]["bleu"]["score"]
    assert systems[1]["metrics"]["chrf"]["score"] == systems[0]["metrics"]["chrf"]["score"]
    best = world.run / "checkpoints" / "best.pt"
    done = ok("compare", "--ref", ref, greedy, best, "--src", src, "--beam", "1", "--json",
              "--device", "cpu")  # fmt: skip
    baseline, system = (s["metrics"] for s in json.loads(done.stdout)["systems"])
    assert system["chrf"]["score"] == baseline["chrf"]["score"]
    expected = sacrebleu.corpus_chrf(read_lines(greedy), [read_lines(ref)]).score
    assert system["chrf"]["score"] == pytest.approx(expected)


def test_evaluate_metrics_equal_sacrebleus(world: World, tmp_path: Path) -> None:
    hyps = tmp_path / "hyp.txt"
    args = ["evaluate", "--model", world.run, "--split", "valid", "--device", "cpu"]
    done = ok(*args, "--out", hyps, "--metrics", "ter,bleu,chrf++", "--json")
    found = json.loads(done.stdout)
    hypotheses, references = read_lines(hyps), read_lines(world.corpus["valid.tgt"])
    for name, metric in (
        ("bleu", sacrebleu.BLEU()),
        ("chrf++", sacrebleu.CHRF(word_order=2)),
        ("ter", sacrebleu.TER()),
    ):
        assert found[name] == metric.corpus_score(hypotheses, [references]).score
        assert found[f"{name}_signature"] == str(metric.get_signature())
    assert "chrf" not in found and found["sentences"] == 8
    text = ok(*args, "--out", hyps, "--metrics", "chrf++").stdout.decode().splitlines()
    assert text[0].startswith("chrF++ ") and text[1].startswith("chrF++ signature: nrefs:1|")


def test_comet_from_a_local_model(world: World, fake_comet: Path, tmp_path: Path) -> None:
    """COMET is the mean of the model's segment scores (x 100), in evaluate and, resampled by
    sacreBLEU's paired bootstrap, in compare."""
    from attn_mt.comet import load_comet

    src, ref = world.corpus["valid.src"], world.corpus["valid.tgt"]
    hyps = tmp_path / "hyp.txt"
    args = ["evaluate", "--model", world.run, "--src", src, "--ref", ref, "--out", hyps]
    done = ok(*args, "--metrics", "bleu,comet", "--comet-model", fake_comet, "--json")
    found = json.loads(done.stdout)
    model = load_comet(fake_comet)
    samples = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(
        read_lines(src), read_lines(hyps), read_lines(ref), strict=True)]  # fmt: skip
    segments = model.predict(samples, 8, 0, False).scores
    assert found["comet"] == pytest.approx(100 * sum(segments) / len(segments))
    assert "model:wmt-test-comet" in found["comet_signature"]
    assert "comet:0.0-test" in found["comet_signature"]

    references = read_lines(ref)
    base = write_lines(tmp_path / "base.txt", [r.split()[0] for r in references])
    done = ok("compare", "--ref", ref, base, ref, "--src", src, "--metrics", "comet",
              "--comet-model", fake_comet, "--json")  # fmt: skip
    figures = [s["metrics"]["comet"] for s in json.loads(done.stdout)["systems"]]
    share = {name: np.array([model.predict([{"src": "", "mt": h, "ref": r}], 8, 0, False).scores[0]
             for h, r in zip(read_lines(path), references, strict=True)])
             for name, path in (("base", base), ("ref", ref))}  # fmt: skip
    assert figures[1]["score"] == pytest.approx(100 * share["ref"].mean())
    # sacreBLEU's paired bootstrap of a mean, written out: its seed, 1,000 resamples
    rng = np.random.default_rng(12345)
    idxs = rng.choice(len(references), size=(1000, len(references)), replace=True)
    sys_means, base_means = (100 * share[n][idxs].mean(axis=1) for n in ("ref", "base"))
    diffs = np.abs(sys_means - base_means)
    delta = 100 * abs(share["ref"].mean() - share["base"].mean())
    p = (np.sum(diffs - diffs.mean() > delta) + 1) / 1001
    assert figures[1]["p"] == pytest.approx(p)
    assert figures[0]["p"] is None and figures[0]["ci"][0] <= figures[0]["score"]


def test_a_model_comet_cannot_load_is_one_line(world: World, tmp_path: Path) -> None:
    failing = "def load_from_checkpoint(path, local_files_only):\n    raise Exception('bad')\n"
    with comet_package(tmp_path, failing) as model:
        src, ref = world.corpus["valid.src"], world.corpus["valid.tgt"]
        args = ["compare", "--ref", ref, ref, "--src", src, "--metrics", "comet"]
        done = run_cli([*args, "--comet-model", model], None, {})
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        f"attn-mt: error: --comet-model {model}: COMET cannot load it (bad); give the model's "
        "folder as downloaded (hparams.yaml, checkpoints/model.ckpt), with its encoder's "
        "tokenizer in the Hugging Face cache"
    ]
