"""Option parsing shared by the allocators: sizes with units and ``NUMBA_BFC_CONF``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

ENV_VAR = "NUMBA_BFC_CONF"

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any, *, name: str = "size") -> int:
    """Parse a byte count: an int, or a string such as ``"8GiB"``, ``"512MiB"``, ``"4096"``.

    Units are binary (KiB/MiB/GiB/TiB, or K/M/G/T). Decimal units (``GB``) are
    rejected rather than guessed.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer number of bytes, not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be an int or a size string, not {type(value).__name__}")
    m = _SIZE_RE.match(value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{name}: cannot parse {value!r} as a size (use bytes or KiB/MiB/GiB/TiB)"
        )
    # Fraction keeps "1.5GiB" exact where a float could round.
    nbytes = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]
    if nbytes.denominator != 1:
        raise ValueError(f"{name}: {value!r} is not a whole number of bytes")
    return int(nbytes)


def parse_bool(value: Any, *, name: str = "option") -> bool:
    """Parse ``true/false/1/0/yes/no/on/off`` (case-insensitive) or a bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "1", "yes", "on"):
            return True
        if v in ("false", "0", "no", "off"):
            return False
    raise ValueError(f"{name}: expected true or false, got {value!r}")


def parse_float(value: Any, *, name: str = "option") -> float:
    """Parse a float from a number or a string."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, not bool")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, got {value!r}") from None


# Every key any component reads from NUMBA_BFC_CONF. One variable configures
# the BFC and caching allocators and the Numba plugin, so each reads its own
# keys and leaves the others' alone; a key no component knows is an error.
_KNOWN_KEYS: set[str] = set()


def register_conf_keys(keys) -> None:
    """Declare keys some component reads from ``NUMBA_BFC_CONF``."""
    _KNOWN_KEYS.update(keys)


def _split_items(text: str) -> list[str]:
    """Split on commas outside ``[...]`` (``roundup_power2_divisions:[256:1,>:4]``)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{ENV_VAR}: unbalanced ']' in {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{ENV_VAR}: unbalanced '[' in {text!r}")
    items.append(text[start:])
    return items


def parse_conf(text: str, parsers: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    """Parse ``"key:value,key:value"`` with one parser per key this caller reads.

    Keys registered by other components (``register_conf_keys``) are skipped;
    unknown keys, repeated keys and bad values raise ``ValueError`` naming the key.
    """
    out: dict[str, Any] = {}
    seen: set[str] = set()
    for item in _split_items(text):
        item = item.strip()
        if not item:
            continue
        key, sep, raw = item.partition(":")
        key = key.strip()
        if not sep:
            raise ValueError(f"{ENV_VAR}: entry {item!r} is not of the form key:value")
        if key in seen:
            raise ValueError(f"{ENV_VAR}: key {key!r} given twice")
        seen.add(key)
        if key in parsers:
            out[key] = parsers[key](raw.strip(), name=key)
        elif key not in _KNOWN_KEYS:
            known = ", ".join(sorted(_KNOWN_KEYS | set(parsers)))
            raise ValueError(f"{ENV_VAR}: unknown key {key!r} (known keys: {known})")
    return out


def conf_from_env(parsers: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    """``parse_conf`` of the ``NUMBA_BFC_CONF`` environment variable (empty if unset)."""
    return parse_conf(os.environ.get(ENV_VAR, ""), parsers)


def parse_str(value: Any, *, name: str = "option") -> str:
    """Identity parser for string options."""
    return str(value)
