"""Config loading: shipped configs, key and type checks, value rules, `--set`, paths, round trip."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO
from helpers.toy import toy_config_dict

from attn_mt.config.data import TrainCorpus
from attn_mt.config.file import apply_override, config_from_dict, load_config, save_config
from attn_mt.config.keys import base_type
from attn_mt.config.schema import Config, config_keys
from attn_mt.errors import ConfigError

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def write_yaml(path: Path, raw: object) -> Path:
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.fixture
def toy_raw(toy_data: dict[str, Path], tmp_path: Path) -> dict:
    return toy_config_dict(toy_data, tmp_path / "run")


def config_error(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    return str(info.value)


def test_configs_are_shipped():
    assert CONFIGS, "configs/*.yaml should hold at least one config"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads(path: Path):
    config = load_config(path)
    assert isinstance(config, Config)
    assert config.data.dataset == "multi30k" or config.data.train.src is not None


@pytest.mark.parametrize(
    ("name", "width", "heads", "d_ff", "dropout"),
    [("wmt14_en_de_base", 512, 8, 2048, 0.1), ("wmt14_en_de_big", 1024, 16, 4096, 0.3)],
)
def test_wmt14_presets_are_vaswanis_models(name, width, heads, d_ff, dropout):
    """Transformer-base/big: ~25k tokens per update, lr d^-0.5 * 4000^-0.5 at the peak,
    validation 50-100 times a run (its cost: docs/distributed.md), each leaving a step_N.pt
    to average. (The data files, the user's, need not exist to load it.)"""
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    m, t = cfg.model, cfg.train
    assert (m.d_model, m.heads, m.d_ff, m.dropout) == (width, heads, d_ff, dropout)
    assert (m.activation_dropout, m.attention_dropout) == (0.0, 0.0)  # residual dropout alone
    assert m.encoder_layers == m.decoder_layers == 6 and t.label_smoothing == 0.1
    assert 20_000 <= t.batch_tokens * t.accumulate <= 30_000
    assert t.lr == pytest.approx(width**-0.5 * t.warmup**-0.5, rel=0.02)
    assert t.max_steps % t.eval_every == 0 and 50 <= t.max_steps // t.eval_every <= 100
    assert t.eval_every // t.valid_loss_every == 4 and t.eval_every % t.valid_loss_every == 0
    assert t.keep_checkpoints >= 5


@pytest.mark.parametrize(
    ("section", "key", "message"),
    [
        (None, "dat", "dat: unknown key; did you mean data?"),
        ("data", "tran", "data.tran: unknown key; did you mean data.train?"),
        ("model", "head", "model.head: unknown key; did you mean model.heads?"),
        ("train", "warmpu", "train.warmpu: unknown key; did you mean train.warmup?"),
    ],
)
def test_unknown_key_names_path_and_closest_key(toy_raw, section, key, message):
    (toy_raw if section is None else toy_raw[section])[key] = 1
    assert config_error(toy_raw).startswith(message)


def test_unknown_nested_key(toy_raw):
    toy_raw["data"]["train"]["scr"] = "x"
    assert config_error(toy_raw) == "data.train.scr: unknown key; did you mean data.train.src?"


def test_unknown_key_without_close_match_lists_valid_keys(toy_raw):
    toy_raw["decode"]["zzzzzz"] = 1
    message = config_error(toy_raw)
    assert message.startswith("decode.zzzzzz: unknown key; valid keys:")
    assert "beam" in message and "length_penalty" in message


@pytest.mark.parametrize(
    ("section", "key", "value", "fragments"),
    [
        ("model", "d_model", "big", ["model.d_model", "'big'", "expected int"]),
        ("model", "d_model", 256.0, ["model.d_model", "256.0", "expected int"]),
        ("model", "d_model", True, ["model.d_model", "True", "expected int"]),
        ("train", "lr", "fast", ["train.lr", "'fast'", "expected float"]),
        ("tokenizer", "joint", "maybe", ["tokenizer.joint", "'maybe'", "expected bool"]),
        ("train", "max_steps", None, ["train.max_steps", "must not be null"]),
        ("model", "norm", "pr", ["model.norm", "'pr'", "one of ['pre', 'post']", "'pre'"]),
        ("train", "seed", [1, 2], ["train.seed", "[1, 2]", "a list", "expected int"]),
    ],
)
def test_wrong_type_names_key_and_value(toy_raw, section, key, value, fragments):
    toy_raw[section][key] = value
    message = config_error(toy_raw)
    for fragment in fragments:
        assert fragment in message


def test_section_must_be_a_mapping(toy_raw):
    toy_raw["model"] = 5
    assert config_error(toy_raw) == "model: expected a mapping of keys, got int 5"


def test_ints_are_accepted_as_floats_and_exponents_without_dot(toy_raw):
    toy_raw["train"]["max_minutes"] = 2
    toy_raw["train"]["lr"] = "5e-4"  # YAML 1.1 reads this as a string
    config = config_from_dict(toy_raw)
    assert config.train.max_minutes == 2.0 and isinstance(config.train.max_minutes, float)
    assert config.train.lr == 5e-4


@pytest.mark.parametrize(
    ("section", "key", "value", "rule"),
    [
        ("model", "heads", 3, "must divide model.d_model (64)"),
        ("model", "dropout", 1.0, "must be in [0, 1)"),
        ("model", "dropout", -0.1, "must be in [0, 1)"),
        ("tokenizer", "vocab_size", 7, "must be >= 8"),
        ("decode", "beam", 0, "must be >= 1"),
        ("train", "lr", -0.5, "must be > 0"),
        ("data", "tgt_lang", "xx", "must differ from data.src_lang"),
    ],
)
def test_invalid_value_names_key_value_and_rule(toy_raw, section, key, value, rule):
    toy_raw[section][key] = value
    message = config_error(toy_raw)
    assert message.startswith(f"{section}.{key}: {value!r} is invalid; ")
    assert rule in message


def test_missing_files_without_dataset(toy_raw):
    del toy_raw["data"]["valid"]
    assert config_error(toy_raw).startswith("data.valid.src: missing;")


def test_yaml_syntax_error_reports_file_and_line(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  dataset: multi30k\n  src_lang: de\n   tgt_lang: en\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: YAML syntax error"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path: Path):
    path = write_yaml(tmp_path / "list.yaml", [1, 2])
    with pytest.raises(ConfigError, match="top level must be a mapping of sections, not a list"):
        load_config(path)


def test_missing_config_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_overrides_are_typed_and_validated(toy_raw, tmp_path: Path):
    path = write_yaml(tmp_path / "toy.yaml", toy_raw)
    config = load_config(
        path, ["train.lr=5e-4", "model.heads=8", "tokenizer.joint=false", "train.out_dir=runs/x"]
    )
    assert config.train.lr == 5e-4
    assert config.model.heads == 8
    assert config.tokenizer.joint is False
    assert config.train.out_dir == "runs/x"
    with pytest.raises(ConfigError, match=r"^model\.heads: 5 is invalid; must divide"):
        load_config(path, ["model.heads=5"])
    with pytest.raises(ConfigError, match=r"^model\.d_model: 'wide' is a string, expected int"):
        load_config(path, ["model.d_model=wide"])


def test_string_override_is_kept_verbatim(toy_raw):
    apply_override(toy_raw, "data.src_lang=1e5")
    apply_override(toy_raw, "data.dataset=null")
    assert toy_raw["data"]["src_lang"] == "1e5"
    assert toy_raw["data"]["dataset"] is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("train.lrr=1", "train.lrr: unknown key; did you mean train.lr?"),
        ("modle.heads=2", "modle: unknown key; did you mean model?"),
        ("train.lr", "--set train.lr: expected KEY=VALUE"),
        ("model=3", "model: is a section; set one of its keys"),
        ("model.heads.x=3", "model.heads: is a value, not a section"),
        ("train.lr=[1, 2", "--set train.lr=[1, 2: cannot parse"),
    ],
)
def test_bad_override(toy_raw, item, message):
    with pytest.raises(ConfigError) as info:
        apply_override(toy_raw, item)
    assert str(info.value).startswith(message)


def test_override_creates_missing_sections():
    raw: dict = {}
    apply_override(raw, "decode.beam=2")
    assert raw == {"decode": {"beam": 2}}


def test_relative_data_paths_resolve_against_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = tmp_path / "configs"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    raw = {
        "data": {
            "train": {"src": "corpus/train.de", "tgt": "/abs/train.en"},
            "valid": {"src": "../valid.de", "tgt": "valid.en"},
        },
        "train": {"max_steps": 10},
    }
    config = load_config(write_yaml(folder / "c.yaml", raw), ["data.test.src=mine/test.de"])
    assert config.data.train.src == str(folder / "corpus" / "train.de")
    assert config.data.train.tgt == "/abs/train.en"
    assert config.data.valid.src == str(tmp_path / "valid.de")
    assert config.data.valid.tgt == str(folder / "valid.en")
    assert config.data.test.src == str(elsewhere / "mine" / "test.de")  # --set: the shell's cwd


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_resolved_config_round_trips(path: Path, tmp_path: Path):
    config = load_config(path, ["train.lr=3e-4"])
    saved = tmp_path / "config.yaml"
    save_config(config, saved)
    assert load_config(saved) == config
    assert set(yaml.safe_load(saved.read_text())) == {f.name for f in dataclasses.fields(Config)}


def test_tiny_trains_for_the_minutes_it_is_given():
    """README's `make train CONFIG=configs/tiny.yaml ARGS='--set train.max_minutes=3'` trains for
    3 minutes: no step or epoch limit of the config ends it first (its max_steps: 20 did)."""
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["train.max_minutes=3"])
    assert (cfg.train.max_steps, cfg.train.max_epochs, cfg.train.max_minutes) == (0, 0, 3)
    assert "CONFIG=configs/tiny.yaml ARGS='--set train.max_minutes=3'" in (
        REPO / "README.md"
    ).read_text(encoding="utf-8")


def test_toy_config_round_trips_with_every_key(toy_raw, tmp_path: Path):
    config = config_from_dict(toy_raw)
    saved = tmp_path / "config.yaml"
    save_config(config, saved)
    assert load_config(saved) == config
    raw = yaml.safe_load(saved.read_text())
    for key, _type, _default, _meaning in config_keys():
        node = raw
        for part in key.split("."):
            node = node[part]  # every leaf key is written out


def test_every_key_has_a_meaning():
    for key, _type, _default, meaning in config_keys():
        assert meaning, f"{key} has no doc in its field metadata (config/schema.py)"


def float_keys(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every float-typed key under the dataclass `node`, list items included."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            yield from float_keys(value, f"{path}.")
        elif isinstance(value, list):  # of corpora (data.pairs holds strings)
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    yield from float_keys(item, f"{path}[{i}].")
        elif base_type(hints[f.name]) is float and value is not None:  # null: no float to check
            yield path, value


def typed(value: Any) -> Any:
    """`value` with the type of every leaf beside it: 0 and 0.0 differ here."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


def test_float_defaults_are_floats():
    defaults = [*float_keys(Config()), *float_keys(TrainCorpus(), "data.train[0].")]
    assert [path for path, value in defaults if type(value) is not float] == []


def _mix() -> dict:
    corpus = {"src": "/a.de", "tgt": "/a.en"}
    return {"data": {"dataset": "multi30k", "train": [corpus, {**corpus, "weight": 2}]}}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_resolved_config_builds_the_same_config_with_the_same_types(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A run resumed from its config.yaml must hash its prepared data as the first run did
    (it named another prepared folder, so every resume encoded the corpus again)."""
    from attn_mt.data import prepare

    config = load_config(path)
    saved = tmp_path / "config.yaml"
    save_config(config, saved)
    again = config_from_dict(yaml.safe_load(saved.read_text(encoding="utf-8")))
    assert again == config
    assert typed(dataclasses.asdict(again)) == typed(dataclasses.asdict(config))
    assert [key for key, value in float_keys(again) if type(value) is not float] == []
    # The prepared folder's name, with the input files' hashes left out (no corpus needed).
    corpus = TrainCorpus(src="a", tgt="b")
    monkeypatch.setattr(prepare, "train_corpora", lambda data: [corpus])
    monkeypatch.setattr(prepare, "_digest", lambda file: {})
    assert prepare.plan(again).folder == prepare.plan(config).folder


def test_a_corpus_mix_keeps_float_weights():
    config = config_from_dict(_mix())
    assert [c.weight for c in config.data.train] == [1.0, 2.0]
    assert all(type(value) is float for _, value in float_keys(config))


def _outside(meta: typing.Mapping[str, Any], kind: str) -> Any:
    """A value just outside a key's bounds (and not its `off` value), of the key's type."""
    step, kind_of = (1, int) if kind == "int" else (0.5, float)
    if "ge" in meta:
        return kind_of(meta["ge"] - step)
    if "gt" in meta:
        return kind_of(meta["gt"])
    return kind_of(meta["lt"] if "lt" in meta else meta["le"] + step)


BOUNDED = [
    (f"{section.name}.{f.name}", f.type, f.metadata)
    for section in dataclasses.fields(Config)
    for f in dataclasses.fields(section.default_factory)
    if {"ge", "gt", "lt", "le"} & set(f.metadata)
]


@pytest.mark.parametrize(("path", "kind", "meta"), BOUNDED, ids=[row[0] for row in BOUNDED])
def test_every_bound_in_the_metadata_is_enforced(toy_raw, path, kind, meta):
    section, key = path.split(".")
    value = _outside(meta, kind)
    toy_raw.setdefault(section, {})[key] = value
    assert config_error(toy_raw).startswith(f"{path}: {value!r} is invalid; must be")


# ---------------------------------------------------------------------------------------------
# A training budget


@pytest.mark.parametrize("budget", ["max_steps", "max_minutes", "max_epochs", "patience"])
def test_a_config_without_budget_is_refused(toy_raw: dict, tmp_path: Path, budget: str):
    toy_raw["train"]["max_steps"] = 0
    path = write_yaml(tmp_path / "endless.yaml", toy_raw)
    with pytest.raises(ConfigError, match="no budget") as info:
        load_config(path)
    assert "--set train.max_minutes=60" in str(info.value)
    assert "train.max_steps: -1" in str(info.value) and "\n" not in str(info.value)
    assert getattr(load_config(path, [f"train.{budget}=2"]).train, budget) == 2  # any one will do


def test_max_steps_minus_one_runs_until_stopped(toy_raw: dict, tmp_path: Path):
    toy_raw["train"]["max_steps"] = -1
    assert load_config(write_yaml(tmp_path / "until-stopped.yaml", toy_raw)).train.max_steps == -1
    toy_raw["train"]["max_steps"] = -2
    with pytest.raises(ConfigError, match=r"train\.max_steps: -2 is invalid; must be >= -1"):
        config_from_dict(toy_raw)


@pytest.mark.parametrize(
    "given, kept", [(True, "true"), (False, "false"), ("auto", "auto"), ("true", "true")]
)
def test_train_compile_takes_yaml_booleans_and_auto(toy_raw, tmp_path, given, kept):
    """train.compile: auto|true|false, YAML's booleans included, and it survives config.yaml."""
    toy_raw["train"]["compile"] = given
    config = config_from_dict(toy_raw)
    assert config.train.compile == kept
    save_config(config, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml").train.compile == kept


def test_train_compile_rejects_other_values(toy_raw):
    toy_raw["train"]["compile"] = "sometimes"
    assert "train.compile: 'sometimes' is invalid; must be one of" in config_error(toy_raw)
    toy_raw["train"]["compile"] = 1
    assert "train.compile" in config_error(toy_raw)
