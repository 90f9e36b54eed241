"""`--set SECTION=MAPPING`: a section's key takes a YAML mapping, whose keys are set as
`--set SECTION.KEY=...` sets them (data.train, the one corpus, also a list of corpora); any
other value for a section is refused in one line saying both ways to give it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.toy import toy_config_dict

from attn_mt.config.file import load_config
from attn_mt.errors import ConfigError


@pytest.fixture
def config(toy_data: dict[str, Path], tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(toy_config_dict(toy_data, tmp_path / "run")))
    return path


def test_a_mapping_sets_a_section(config: Path, toy_data: dict[str, Path]) -> None:
    src, tgt = toy_data["valid.src"], toy_data["valid.tgt"]
    cfg = load_config(config, [f"data.train={{src: {src}, tgt: {tgt}}}"])
    assert (cfg.data.train.src, cfg.data.train.tgt) == (str(src), str(tgt))
    corpora = load_config(config, [f"data.train=[{{src: {src}, tgt: {tgt}, weight: 2}}]"])
    assert [(c.src, c.weight) for c in corpora.data.train] == [(str(src), 2.0)]
    model = load_config(config, ["model={d_ff: 48, dropout: 0.0}"]).model
    before = load_config(config, []).model
    assert (model.d_ff, model.dropout, model.d_model) == (48, 0.0, before.d_model)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("data.train=3", "data.train: is a section; set one of its keys"),
        ("model=[1, 2", "model: is a section; set one of its keys (--set model.KEY=VALUE)"),
        ("data.train={src: a, tgtt: b}", "data.train.tgtt: unknown key; did you mean"),
    ],
)
def test_a_section_given_no_mapping_is_refused(config: Path, item: str, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(config, [item])
    assert words in str(refused.value)
