"""Plain data (a YAML file's, a checkpoint's) into the `Config` dataclasses, checked key by
key: every unknown key named with the closest valid one, every value of the wrong type named with
the key, the value and the type expected, a float key holding a float even from `2`, an integer
key fitting in 32 bits. `config/file.py` reads the files and overrides that give the data.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, Union

from attn_mt.config.keys import base_type, mapping_shape, reject, shown, type_name
from attn_mt.errors import ConfigError

# YAML 1.1 reads `5e-4` (no dot) as a string; float fields accept such numbers anyway.
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
# Every integer key is passed to C code somewhere (torch, SentencePiece): it must fit in 32 bits.
INT_LIMIT = 2**31


def kind(value: Any) -> str:
    """What kind of YAML value `value` is, in words: "a mapping", "a list", "a string", "int"."""
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)


def list_item(hint: Any) -> Any:
    """`Files | list[Corpus]` -> Corpus; None when a list is not allowed."""
    for arg in typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else ():
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    return None


class UnknownKey(ConfigError):
    """A key the schema does not have (`config.file.load_config` collects them all into one
    error)."""


def unknown_keys(cls: type, raw: Any, prefix: str) -> list[str]:
    """The message of every unknown key in `raw`, a section of dataclass `cls`, and below."""
    if not isinstance(raw, dict):
        return []  # the wrong kind of value: `build` says so
    hints = typing.get_type_hints(cls)
    found = []
    for key, value in raw.items():
        if key not in hints:
            try:
                unknown(prefix.rstrip("."), key, list(hints))
            except UnknownKey as err:
                found.append(str(err))
            continue
        item = list_item(hints[key])
        if item is not None and isinstance(value, list):
            for i, entry in enumerate(value):
                found += unknown_keys(item, entry, f"{prefix}{key}[{i}].")
        elif dataclasses.is_dataclass(mapping_shape(hints[key])):
            found += unknown_keys(mapping_shape(hints[key]), value, f"{prefix}{key}.")
    return found


def unknown(prefix: str, key: str, valid: list[str]) -> typing.NoReturn:
    """Refuse `key` under section `prefix`, naming the closest of the `valid` keys (or all)."""
    path = f"{prefix}.{key}" if prefix else str(key)
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
    hint = (
        f"did you mean {prefix + '.' if prefix else ''}{close[0]}?"
        if close
        else (f"valid keys: {', '.join(valid)}")
    )
    raise UnknownKey(f"{path}: unknown key; {hint}")


def build(cls: type, raw: Any, prefix: str) -> Any:
    """Recursively turn a dict into dataclass `cls`, checking keys and types."""
    where = prefix.rstrip(".") or "config"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {kind(raw)} {shown(raw)}")
    hints = typing.get_type_hints(cls)
    docs = {f.name: f.metadata.get("doc") for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in hints:
            unknown(prefix.rstrip("."), key, list(hints))
    values: dict[str, Any] = {}
    for name, hint in hints.items():
        if name not in raw:
            continue
        item = list_item(hint)
        if item is not None and isinstance(raw[name], list):
            values[name] = [
                build(item, entry, f"{prefix}{name}[{i}].") for i, entry in enumerate(raw[name])
            ]
        elif raw[name] is None and base_type(hint) is not hint:
            values[name] = None  # an optional group (a corpus's filters) left null
        elif dataclasses.is_dataclass(mapping_shape(hint)):
            values[name] = build(mapping_shape(hint), raw[name], f"{prefix}{name}.")
        else:
            values[name] = _coerce(f"{prefix}{name}", raw[name], hint, docs[name])
    return cls(**values)


def _coerce(key: str, value: Any, hint: Any, doc: str | None = None) -> Any:
    """Check `value` against the field's type hint; a float key holds a float, even from `2`.
    A list's wrong item is named with the key's `doc`, which shows the form expected."""
    base = base_type(hint)
    if value is None:
        if base is not hint:
            return None
        raise ConfigError(f"{key}: must not be null (expected {type_name(hint)})")
    if typing.get_origin(base) is Literal:
        choices = typing.get_args(base)
        if isinstance(value, bool) and "true" in choices:  # YAML's true/false: train.compile
            value = str(value).lower()
        elif value is False and "off" in choices:  # YAML reads `off` as false: decode.recase
            value = "off"
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f"; did you mean {close[0]!r}?" if close else ""
            reject(key, value, f"must be one of {list(choices)}{extra}")
        return value
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_LIMIT <= value < INT_LIMIT:
                reject(key, value, f"must be below {INT_LIMIT:,} in size")
            return value
    elif base is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e300 else math.inf
        elif isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            number = float(value)
        if number is not None:
            if not math.isfinite(number):
                reject(key, value, "must be a finite number")
            return number
    elif base is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif typing.get_origin(base) is list and isinstance(value, list):  # plain values: data.pairs
        [wanted] = typing.get_args(base)
        for i, item in enumerate(value):
            if not isinstance(item, wanted):
                about = f" ({key}: {doc})" if doc else ""
                what, name = kind(item), type_name(wanted)
                raise ConfigError(f"{key}[{i}]: {shown(item)} is {what}, expected {name}{about}")
        return list(value)
    raise ConfigError(f"{key}: {shown(value)} is {kind(value)}, expected {type_name(hint)}")
