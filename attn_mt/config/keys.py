"""How a config key is declared and checked: `key(default, doc, bounds...)` keeps a key's
meaning and its own range in the dataclass field's metadata (fairseq's `field(metadata=...)`
pattern), `check_keys` checks a tree of such dataclasses in one loop, and `reject` words every
error the same way. The schema itself is `attn_mt.config.schema`.
"""

from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from attn_mt.errors import ConfigError

_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxdict = 2, 3, 3
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60


def key(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    off: float | None = None,
    why: str = "",
    rule: tuple[Callable[[Any], Any], str] | None = None,
) -> Any:
    """A config key: its default, its meaning and its own constraints, kept in field metadata.

    Args:
        default: the value when the config leaves the key out.
        doc: what the key means (the docs' key table shows it).
        ge, gt, lt, le: bounds, value >= ge, > gt, < lt, <= le (None: no bound).
        off: a value outside the bounds that turns the feature off (e.g. 0).
        why: the reason for a `ge` bound, shown in its error.
        rule: (test, text): the value must pass `test`; `text` says how, in the error.
    """
    given = {"ge": ge, "gt": gt, "lt": lt, "le": le, "off": off, "why": why or None, "rule": rule}
    metadata = {"doc": doc} | {name: value for name, value in given.items() if value is not None}
    return dataclasses.field(default=default, metadata=metadata)


def group(cls: type, doc: str) -> Any:
    """A key holding a group of keys (a section, or a split's files), defaulted to `cls()`."""
    return dataclasses.field(default_factory=cls, metadata={"doc": doc})


def check_keys(node: Any, prefix: str) -> None:
    """Check every key under the dataclass `node` against the constraints in its metadata."""
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_keys(value, f"{path}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):  # a list of corpora, not of plain values
                    check_keys(item, f"{path}[{i}].")
        elif value is not None:
            _check_key(path, value, f.metadata)


def _check_key(path: str, value: Any, meta: typing.Mapping[str, Any]) -> None:
    ge, gt, lt, le = (meta.get(bound) for bound in ("ge", "gt", "lt", "le"))
    within = (
        (ge is None or value >= ge)
        and (gt is None or value > gt)
        and (lt is None or value < lt)
        and (le is None or value <= le)
    )
    if not within and not ("off" in meta and value == meta["off"]):
        reject(path, value, _bounds_rule(meta))
    if "rule" in meta:
        test, text = meta["rule"]
        if not test(value):
            reject(path, value, text)


def _bounds_rule(meta: typing.Mapping[str, Any]) -> str:
    """The constraint of `meta`'s bounds in words: 'must be in [0, 1)', 'must be >= 1'."""
    ge, gt, lt, le = (meta.get(bound) for bound in ("ge", "gt", "lt", "le"))
    if ge is not None and (lt is not None or le is not None):
        return f"must be in [{ge}, {lt})" if lt is not None else f"must be in [{ge}, {le}]"
    if gt is not None and (lt is not None or le is not None):
        return f"must be in ({gt}, {lt})" if lt is not None else f"must be in ({gt}, {le}]"
    if "off" in meta:
        return f"must be {meta['off']} (off) or >= {ge}"
    if gt is not None:
        return f"must be > {gt}"
    return f"must be >= {ge}" + (f" ({meta['why']})" if "why" in meta else "")


def reject(key: str, value: Any, rule: str) -> typing.NoReturn:
    """Raise the ConfigError for a bad value: `key: value is invalid; rule`."""
    raise ConfigError(f"{key}: {shown(value)} is invalid; {rule}")


def shown(value: Any) -> str:
    """`repr(value)`, cut short (a YAML alias bomb is a list of a billion items); a huge
    integer is described by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    return _SHORT_REPR.repr(value)


def mapping_shape(hint: Any) -> Any:
    """`Files | list[Corpus]` -> Files (a mapping is the shape `--set` and the docs use)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        shapes = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        return shapes[0] if shapes else hint
    return hint


def base_type(hint: Any) -> Any:
    """`int | None` -> int; other hints unchanged."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def type_name(hint: Any) -> str:
    """A key's type as the docs and errors write it: `int`, `str or null`, `pre|post`."""
    if typing.get_origin(hint) is Literal:
        return "|".join(str(a) for a in typing.get_args(hint))
    base = base_type(hint)
    name = getattr(base, "__name__", str(base))
    return name + (" or null" if base is not hint else "")
