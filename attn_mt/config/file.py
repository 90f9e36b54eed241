"""Config files: YAML -> a checked `Config`, `--set` overrides, and the resolved `config.yaml`.

The schema (keys, defaults, meanings, ranges) is `attn_mt.config.schema`; `config/build.py`
turns plain data into it, key by key (an unknown key named with its full path and the closest
valid key; a value of the wrong type with the key, the value and the type expected). This
module reads the YAML strictly, applies `--set`, and resolves relative data paths against the
config file's folder (those given with `--set`, against the shell's).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from attn_mt.config.build import UnknownKey, build, kind, unknown, unknown_keys
from attn_mt.config.keys import base_type, mapping_shape
from attn_mt.config.schema import Config, TrainConfig
from attn_mt.errors import ConfigError
from attn_mt.fileio import os_reason

# A config is three levels deep; far deeper YAML is a mistake (and recursed without end).
MAX_DEPTH = 20


class _Refused(yaml.YAMLError):
    """Well-formed YAML that is almost surely a mistake (a duplicate key, absurd nesting)."""

    def __init__(self, line: int, problem: str):
        super().__init__(problem)
        self.line, self.problem = line, problem


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate mapping keys and nesting deeper than MAX_DEPTH."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _Refused(line, f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise _Refused(
                    line, f"duplicate key {key!r} (first at line {seen[key]}); keep only one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def parse_yaml(text: str) -> Any:
    """YAML text -> plain data, with the duplicate-key and depth checks of `_StrictLoader`."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except ValueError as err:  # an integer of more than 4300 digits
        raise _Refused(1, f"a value cannot be read ({err})") from None


def load_config(
    path: str | Path, overrides: typing.Sequence[str] = (), training: bool = True
) -> Config:
    """Read a YAML config file, apply `key.path=value` overrides, and validate the result;
    `training=False` (prepare, data info) does not ask for a training budget."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give the YAML config file")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config ({os_reason(err)})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: cannot read config ({err})") from None
    try:
        raw = parse_yaml(text)
    except _Refused as err:
        raise ConfigError(f"{path}:{err.line}: {err.problem}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        # A ReaderError (control or binary characters) has a `reason` instead of a `problem`.
        problem = getattr(err, "problem", None) or getattr(err, "reason", None) or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {kind(raw)}")
    _resolve_data_paths(raw, path.parent)
    unknown = unknown_keys(Config, raw, "")  # every typo at once, the file's and --set's
    for item in overrides:
        try:
            apply_override(raw, item)
        except UnknownKey as err:
            unknown.append(str(err))
    if len(unknown) == 1:
        raise ConfigError(unknown[0])
    if unknown:
        raise ConfigError(f"{len(unknown)} unknown keys: " + "; ".join(unknown))
    _resolve_data_paths(raw, Path.cwd())  # paths given with --set are relative to the shell
    _expand_home(raw)
    config = config_from_dict(raw)
    if training:
        _check_budget(config.train)
    return config


def config_from_dict(raw: dict[str, Any], files: bool = True) -> Config:
    """Build and validate a Config from plain nested dicts (a YAML file or a checkpoint);
    `files` False: a model's config, whose data.* need not name training files. The config
    records the keys `raw` gives (`Config.given`)."""
    config = build(Config, raw, prefix="")
    config.validate(files)
    sections = [(name, keys) for name, keys in raw.items() if isinstance(keys, dict)]
    written = frozenset(f"{name}.{key}" for name, keys in sections for key in keys)
    config.__dict__["_given"] = written  # beside the fields: `Config.given`
    return config


# What a run started from a checkpoint takes from it where its config does not write them
# (`inherit_keys`): sections whole, or one key of a section.
INHERITED = ("model", "tokenizer", "decode", "data.src_lang", "data.tgt_lang")


def inherit_keys(config: Config, source: Config) -> Config:
    """`config` with every INHERITED key it does not write (`Config.given`) taken from `source`,
    the config of the checkpoint a run starts from, and validated again; the keys it writes
    are its own (whether they may differ from the checkpoint's, its caller decides)."""
    given = config.given()
    if given is None:  # made in code: every key is written
        return config
    raw, theirs = config.to_dict(), source.to_dict()
    for name in INHERITED:
        section, _, key = name.partition(".")
        for item in [key] if key else list(raw[section]):
            if f"{section}.{item}" not in given:
                raw[section][item] = theirs[section][item]
    inherited = config_from_dict(raw)
    inherited.__dict__["_given"] = given  # still what the user wrote
    return inherited


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `--set a.b=value` to the raw dict; the value is parsed as YAML. A section's
    key takes a YAML mapping (`--set 'data.train={src: A, tgt: B}'`), whose keys are set as
    `--set data.train.src=A --set data.train.tgt=B` would set them (a list, where the section
    may be one, as data.train's corpora: replacing it)."""
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set train.lr=0.0005")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    field_type = _field_type(parts)  # raises on unknown keys
    value: Any
    if dataclasses.is_dataclass(field_type):
        value = _section_value(".".join(parts), text)
    elif base_type(field_type) is str:
        value = None if text.strip() in ("null", "~") else text
    else:
        try:
            value = parse_yaml(text) if text.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"--set {item}: cannot parse {text!r} as a value") from None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, list):
            raise ConfigError(
                f"--set {item}: {'.'.join(parts[: i + 1])} is a list of corpora in the config; "
                "edit the file instead"
            )
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    section = dataclasses.is_dataclass(field_type) and isinstance(value, dict)
    if section and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]] |= value
    else:
        node[parts[-1]] = value


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config (every default filled in) as YAML."""
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Internals


def _check_budget(train: TrainConfig) -> None:
    """Refuse a training config that would never stop by itself, unless it says so."""
    if not (train.max_steps or train.max_minutes or train.max_epochs or train.patience):
        raise ConfigError(
            "train: no budget (max_steps, max_minutes, max_epochs and patience are all 0); "
            "set one, e.g. --set train.max_minutes=60, or train.max_steps: -1 to run until stopped"
        )


def _resolve_data_paths(raw: dict[str, Any], base: Path) -> None:
    """Make relative data file paths relative to the config file's folder."""
    data = raw.get("data")
    if not isinstance(data, dict):
        return
    entries: list[Any] = [data] if isinstance(data.get("prepared_dir"), str) else []
    for split in ("train", "valid", "valid_general", "test"):
        files = data.get(split)
        entries += files if isinstance(files, list) else [files]
    for corpus in [data, *(entry for entry in entries if isinstance(entry, dict))]:
        entries.append(corpus.get("filters"))  # the models of the score rule
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        for key in ("src", "tgt", "prepared_dir", "score", "score_backward"):
            value = entry.get(key)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                entry[key] = str((base / value).resolve())
            elif isinstance(value, str):
                entry[key] = str(Path(value).expanduser())


def _expand_home(raw: dict[str, Any]) -> None:
    """`~` in train.out_dir and train.init_from means the home folder, as a shell user expects."""
    train = raw.get("train")
    for key in ("out_dir", "init_from"):
        if isinstance(train, dict) and isinstance(train.get(key), str):
            train[key] = os.path.expanduser(train[key])  # "" stays "" (and is refused)


def _field_type(parts: list[str]) -> Any:
    """The type hint of a dotted key, or a ConfigError naming the unknown part."""
    cls: Any = Config
    for i, part in enumerate(parts):
        hints = typing.get_type_hints(cls)
        if part not in hints:
            unknown(".".join(parts[:i]), part, list(hints))
        cls = mapping_shape(hints[part])
        if i < len(parts) - 1 and not dataclasses.is_dataclass(cls):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section")
    return cls


def _section_value(key: str, text: str) -> Any:
    """The YAML mapping (or list of them) `--set KEY=...` gives the section `key`."""
    try:
        value = parse_yaml(text) if text.strip() else None
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict | list):
        raise ConfigError(
            f"{key}: is a section; set one of its keys (--set {key}.KEY=VALUE) or give it a "
            f"YAML mapping (--set '{key}={{KEY: VALUE, ...}}')"
        )
    return value
