from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NoReturn, TypeAlias, TypeVar

Json: TypeAlias = "None | bool | int | float | str | list[Json] | dict[str, Json]"
JsonObject: TypeAlias = "dict[str, Json]"


class Missing(enum.Enum):
    """The type of `MISSING`: a union tag that is not on the wire. (An absent optional member
    reads as `None`.)"""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing.MISSING


def _assert_never(value: NoReturn) -> NoReturn:
    # typing.assert_never is 3.11+; a NoReturn parameter gives mypy the same exhaustiveness check.
    raise AssertionError("unhandled value: " + repr(value))


@dataclass(frozen=True)
class UnknownCase:
    """A display union's case this version does not know, kept as sent."""

    raw: JsonObject

    @property
    def method(self) -> str | None:
        """The `method` of an unknown notification (or request) as sent; None when absent."""
        value = self.raw.get("method")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class UnknownValue:
    """A display enum's value this version does not know, kept as sent."""

    raw: str


class DecodeError(ValueError):
    """A value that does not have the shape its type needs; `path` points at it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path + ": " + message)
        self.path = path


def _kind(raw: object) -> str:
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "boolean"
    if isinstance(raw, (int, float)):
        return "number"
    if isinstance(raw, str):
        return "string"
    if isinstance(raw, list):
        return "array"
    return "object"


def _member_path(path: str, key: str) -> str:
    return path + "." + key if key.isidentifier() else path + "[" + repr(key) + "]"


def _index_path(path: str, index: int) -> str:
    return path + "[" + str(index) + "]"


def _object(raw: Json, path: str) -> JsonObject:
    if not isinstance(raw, dict):
        raise DecodeError(path, "expected an object, got " + _kind(raw))
    return raw


def _list(raw: Json, path: str) -> list[Json]:
    if not isinstance(raw, list):
        raise DecodeError(path, "expected an array, got " + _kind(raw))
    return raw


def _require(o: JsonObject, path: str, names: tuple[str, ...]) -> None:
    for name in names:
        if name not in o:
            raise DecodeError(_member_path(path, name), "missing")


def _only(o: JsonObject, path: str, names: frozenset[str], of: str) -> None:
    for name in o:
        if name not in names:
            raise DecodeError(_member_path(path, name), "unknown member of " + of)


def _str(raw: Json, path: str) -> str:
    if not isinstance(raw, str):
        raise DecodeError(path, "expected a string, got " + _kind(raw))
    return raw


def _int(raw: Json, path: str) -> int:
    # JSON has one number type: 3.0 is the integer 3 (JSON Schema agrees).
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise DecodeError(path, "expected an integer, got " + _kind(raw))
    return raw


def _uint(raw: Json, path: str) -> int:
    n = _int(raw, path)
    if n < 0:
        raise DecodeError(path, "expected an integer >= 0")
    return n


def _uint_or_str(raw: Json, path: str) -> int | str:
    if isinstance(raw, str):
        return raw
    return _uint(raw, path)


def _float(raw: Json, path: str) -> float:
    if not isinstance(raw, (int, float)) or isinstance(raw, bool):
        raise DecodeError(path, "expected a number, got " + _kind(raw))
    return raw


def _bool(raw: Json, path: str) -> bool:
    if not isinstance(raw, bool):
        raise DecodeError(path, "expected a boolean, got " + _kind(raw))
    return raw


def _is_tag(raw: object, expected: str | int | bool) -> bool:
    if isinstance(expected, bool) or isinstance(raw, bool):
        return raw is expected
    if isinstance(expected, int):
        return isinstance(raw, (int, float)) and raw == expected
    return isinstance(raw, str) and raw == expected


_Built = TypeVar("_Built")


def _build(cls: type[_Built], members: dict[str, Any], nulls: frozenset[str] | None = None) -> _Built:
    """A frozen dataclass from members the decoder has already checked, every field given.
    Skips the generated `__init__`, whose `object.__setattr__` per field was most of the cost of
    a typed notification; equality, hashing, repr and `dataclasses.replace` read the same fields.
    `nulls`: the optional members that were an explicit `null` (so the encoder writes them again)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(members)
    if nulls:
        obj.__dict__["_nulls"] = nulls
    return obj


def _nulls(o: JsonObject, names: tuple[str, ...]) -> frozenset[str] | None:
    found = [name for name in names if name in o and o[name] is None]
    return frozenset(found) if found else None


def _const(raw: Json, path: str, expected: str | int | bool) -> None:
    if not _is_tag(raw, expected):
        raise DecodeError(path, "expected " + repr(expected))

