"""`attn_mt.compare`: the scores, intervals and p-values are those sacreBLEU's own command line
prints for `--paired-bs` and `--paired-ar` with its default seed; the JSON has the shape
DESIGN.md fixes; the table marks what differs at p < 0.05."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.toy import write_lines

from attn_mt.compare import compare, compare_files

SACREBLEU = Path(sys.executable).parent / "sacrebleu"
WORDS = [f"w{i}" for i in range(30)] + ["The", "the", ",", "."]
CELL = re.compile(r"(\d+\.\d{6})(?: \((\d+\.\d{6}) ± (\d+\.\d{6})\))?")  # score (mean ± half)
P_VALUE = re.compile(r"\(p = (\d\.\d{4})\)")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A reference of 60 sentences and three systems: the baseline, one about as good (its
    difference is chance) and one clearly better."""
    rng = random.Random(5)
    refs = [[rng.choice(WORDS) for _ in range(rng.randint(4, 12))] for _ in range(60)]
    folder = tmp_path_factory.mktemp("compare")
    found = {"ref": write_lines(folder / "ref.txt", [" ".join(r) for r in refs])}
    for name, kept in (("base", 0.6), ("same", 0.62), ("better", 0.8)):
        lines = [" ".join(w if rng.random() < kept else rng.choice(WORDS) for w in r) for r in refs]
        found[name] = write_lines(folder / f"{name}.txt", lines)
    return found


def sacrebleu_cli(files: dict[str, Path], *args: str) -> tuple[list[tuple], list[float]]:
    """sacreBLEU's paired test as its command line prints it (6 decimals, p to 4): the cells
    (score, mean, half-interval) system by system, metric by metric; the p-values alike."""
    systems = [str(files[name]) for name in ("base", "same", "better")]
    command = [
        str(SACREBLEU),
        str(files["ref"]),
        "-i",
        *systems,
        *args,
        "-f",
        "text",
        "-w",
        "6",
        "-nc",
        "-q",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    table = done.stdout.split("Paired ")[0]
    cells = [tuple(float(x) if x else None for x in m) for m in CELL.findall(table)]
    return cells, [float(p) for p in P_VALUE.findall(table)]


@pytest.mark.parametrize(
    ("paired", "metrics", "cli_args"),
    [
        ("bs", ["bleu", "chrf", "ter"], ["-m", "bleu", "chrf", "ter", "--paired-bs"]),
        ("ar", ["chrf++"], ["-m", "chrf", "--chrf-word-order", "2", "--paired-ar"]),
    ],
)
def test_figures_are_sacrebleus_command_lines(
    files: dict[str, Path], paired: str, metrics: list[str], cli_args: list[str]
) -> None:
    cells, p_values = sacrebleu_cli(files, *cli_args)
    result = compare_files(
        [files["base"], files["same"], files["better"]],
        files["ref"],
        metrics=metrics,
        paired=paired,
    )
    found = [f for figures in result.figures for f in figures.values()]
    assert len(found) == len(cells) == 3 * len(metrics)
    for figure, (score, mean, half) in zip(found, cells, strict=True):
        assert figure.score == pytest.approx(score, abs=1e-6)
        if paired == "bs":  # sacreBLEU's command line gives intervals for the bootstrap alone
            assert figure.ci == pytest.approx((mean - half, mean + half), abs=1e-5)  # float32
        low, high = figure.ci
        assert low < high
    assert [f.p for f in found[: len(metrics)]] == [None] * len(metrics)  # the baseline's
    assert [f.p for f in found[len(metrics) :]] == pytest.approx(p_values, abs=5e-5)
    same, better = (
        [f.p for f in figures.values()] for figures in result.figures[1:]
    )  # chance against a clear difference
    assert min(same) > 0.05 and max(better) < 0.05


def test_json_shape_and_table(files: dict[str, Path]) -> None:
    with_refs = [(n, files[n].read_text().splitlines()) for n in ("base", "same", "better")]
    result = compare(with_refs, files["ref"].read_text().splitlines(), ["bleu", "ter"])
    data = result.to_dict()
    assert [s["name"] for s in data["systems"]] == ["base", "same", "better"]
    for system in data["systems"]:
        assert list(system["metrics"]) == ["bleu", "ter"]
        for figure in system["metrics"].values():
            assert set(figure) == {"score", "ci", "p"} and len(figure["ci"]) == 2
    assert data["systems"][0]["metrics"]["bleu"]["p"] is None
    table = result.table().splitlines()
    assert table[0].split() == ["system", "BLEU", "TER"]
    assert table[1].startswith("base (baseline)") and " p " not in table[1]
    better = result.figures[2]["bleu"]
    assert (
        f"{better.score:.2f} [{better.ci[0]:.2f}, {better.ci[1]:.2f}] p {better.p:.4f} *"
        in (table[3])
    )
    assert "TER: lower is better" in result.table()
    assert "BLEU signature: nrefs:1|bs:1000|seed:12345|" in result.table()
