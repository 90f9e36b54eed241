"""scripts/bench_soak.py (bench/soak.py) in its quick mode: both loops train, rows and profiles
come out, and the last line is the JSON the bench_*.py scripts end with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.toy import toy_config_dict

from attn_mt.train.runlog import RunLog
from bench import soak


def test_quick_soak_reports_both_loops_per_row(
    toy_data: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    scripted_validation,
) -> None:
    scripted_validation()  # the bench's own figures are under test here, not validation's
    monkeypatch.setattr(RunLog, "attention", lambda *args: None)
    raw = toy_config_dict(toy_data, tmp_path / "unused", eval_every=100, batch_tokens=256)
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "soak"
    args = ["--config", str(config), "--quick", "--steps", "3", "--minutes", "60"]
    args += ["--chunk", "0", "--row-seconds", "0", "--profile-at", "0", "--profile-steps", "1"]
    soak.main([*args, "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    assert (figures["bench"], figures["steps"]) == ("soak", 3)
    rows = figures["rows"]  # a row per update; the first, profiled, is in the second's row
    assert [row["step"] for row in rows] == [2, 3]
    for row in rows:
        assert row["attn_tok_s"] > 0 and row["ref_tok_s"] > 0 and row["rss_mib"] > 0, rows
        assert row["ratio"] == pytest.approx(row["attn_tok_s"] / row["ref_tok_s"], rel=1e-3)
    assert set(figures["summary"]["change"]) >= {"attn_tok_s", "ref_tok_s", "ratio", "rss_mib"}
    assert figures["profiles"] == ["m0"]
    tables = sorted(path.name for path in out.glob("profile_*.txt"))
    assert tables == ["profile_m0_attn-mt.txt", "profile_m0_nn_Transformer.txt"]
    assert "Self CPU" in (out / tables[0]).read_text()
    assert (out / "checkpoints" / "last.pt").is_file()  # attn-mt's own loop ran, to its end
