"""Typed, frozen configuration: YAML files + dotted command-line overrides.

A config schema is a tree of frozen dataclasses. Every leaf is annotated with a plain type
(``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``tuple[X, ...]``,
``dict[str, X]``) and may carry range metadata made with :func:`field` (``ge``/``gt``/``le``/``lt``).

Loading is strict: an unknown key is an error that names the full dotted key and suggests the
closest known key; a value of the wrong type or out of range names the key and what is allowed.
Cross-field rules live in each dataclass's ``__post_init__`` and raise :class:`ConfigError`.

YAML is read with ``yaml.safe_load`` only. A file may say ``extends: other.yaml`` (relative to
itself) to start from another file; mappings are merged key by key, the child winning.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")

_MISSING = dataclasses.MISSING


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


def field(default: Any = _MISSING, *, default_factory: Any = _MISSING, ge=None, gt=None, le=None, lt=None,
          doc: str = "") -> Any:
    """A dataclass field with optional numeric bounds (checked on load) and a one-line doc."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, doc=doc).items() if v is not None}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check(cond: bool, key: str, msg: str) -> None:
    """Raise ConfigError(``key: msg``) unless ``cond``; for use in ``__post_init__``."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")


# ----------------------------------------------------------------------------- type coercion

def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if origin in (tuple, list):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(value, a, key)
        except ConfigError:
            pass
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")


def _coerce_literal(value: Any, tp: Any, key: str) -> Any:
    allowed = get_args(tp)
    if value in allowed and type(value) in {type(a) for a in allowed}:
        return value
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{key}: {value!r} is not allowed; expected {_type_name(tp)}{hint}")


def _coerce_dataclass(value: Any, tp: Any, key: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    return from_dict(tp, value, prefix=key)


def _coerce_sequence(value: Any, tp: Any, key: str) -> tuple:
    """``tuple[X, ...]``, ``list[X]`` (both read as a tuple) and fixed ``tuple[X, Y]``."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    args = get_args(tp)
    if get_origin(tp) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))


def _coerce_mapping(value: Any, tp: Any, key: str) -> dict:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    kt, vt = get_args(tp)
    return {_coerce(k, kt, key): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}


def _coerce_bool(value: Any, tp: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _coerce_int(value: Any, tp: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ConfigError(f"{key}: expected an integer, got {value!r}")


def _coerce_float(value: Any, tp: Any, key: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # yaml reads "1e-5" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(f"{key}: expected a number, got {value!r}")


def _coerce_str(value: Any, tp: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"{key}: expected a string, got {value!r}")


#: the coercer of each kind of annotation: generic origins first, then plain types
_BY_ORIGIN = {Union: _coerce_union, types.UnionType: _coerce_union, Literal: _coerce_literal,
              tuple: _coerce_sequence, list: _coerce_sequence, dict: _coerce_mapping}
_BY_TYPE = {bool: _coerce_bool, int: _coerce_int, float: _coerce_float, str: _coerce_str}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as the annotation ``tp`` requires (the coercer of its kind), or ``ConfigError`` naming ``key``."""
    if tp is Any:
        return value
    fn = _BY_ORIGIN.get(get_origin(tp)) or (_coerce_dataclass if dataclasses.is_dataclass(tp) else _BY_TYPE.get(tp))
    if fn is None:  # pragma: no cover - schema bug
        raise ConfigError(f"{key}: unsupported annotation {tp!r}")
    return fn(value, tp, key)


def _check_range(value: Any, meta: Mapping[str, Any], key: str) -> None:
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for name, op, word in (("ge", float.__ge__, ">="), ("gt", float.__gt__, ">"),
                           ("le", float.__le__, "<="), ("lt", float.__lt__, "<")):
        if name in meta and not op(float(value), float(meta[name])):
            raise ConfigError(f"{key}: {value!r} is out of range; must be {word} {meta[name]}")


def from_dict(cls: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, strictly (see module docstring)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    removed = getattr(cls, "REMOVED_KEYS", {})  # key -> why it went (a class attribute of the section)
    for k in data:
        if k not in fields and k in removed:
            full = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"unknown key {full!r}: it was removed ({removed[k]}); delete it from the config")
        if k not in fields:
            full = f"{prefix}.{k}" if prefix else str(k)
            close = difflib.get_close_matches(str(k), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {(prefix + '.' if prefix else '') + close[0]!r}?" if close else ""
            raise ConfigError(f"unknown key {full!r}{hint} (allowed here: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name in data:
            v = _coerce(data[name], hints[name], key)
            _check_range(v, f.metadata, key)
            kwargs[name] = v
        elif f.default is _MISSING and f.default_factory is _MISSING:
            raise ConfigError(f"missing required key {key!r}")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if prefix and not str(e).startswith(prefix):
            raise ConfigError(f"{prefix}.{e}") from None
        raise


def to_dict(cfg: Any) -> Any:
    """Plain-Python (YAML/JSON-safe) view of a config tree."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


# ----------------------------------------------------------------------------- files & overrides

def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a YAML config (``yaml.safe_load``), following ``extends:`` chains."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: 'extends' cycle through {[str(p) for p in _seen]}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: 'extends' must be a file name")
        base = read_yaml(path.parent / parent, _seen + (path.resolve(),))
        data = _merge(base, data)
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"actor.clip_ratio=0.3"`` -> (["actor", "clip_ratio"], 0.3); values parsed as YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r}: empty key segment")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Apply dotted overrides to a raw mapping (before typing)."""
    data = dict(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = {}
            elif not isinstance(child, Mapping):
                raise ConfigError(f"override {text!r}: {p!r} is not a section")
            node[p] = child = dict(child)
            node = child
        node[parts[-1]] = value
    return data


def load(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Load ``schema`` from an optional YAML file plus dotted overrides."""
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides)
    return from_dict(schema, data)


def dump(cfg: Any, path: str | Path) -> None:
    """Write a config tree as YAML (it loads back to an equal config)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
