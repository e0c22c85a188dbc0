"""The few MongoDB query and update operators the store's statements use
(``statements.py``, ``listing.py``), applied to documents in memory: what
lets the memory store (``memory.py``) apply the very filters and updates the
Mongo store sends, instead of restating each rule.

Only what the statements use, with MongoDB's meaning
(https://www.mongodb.com/docs/manual/reference/operator/query/):

* filters: equality (a null matches a missing field; an array field matches
  when it holds the value), ``$in``, ``$nin``, ``$eq``, ``$lt``, ``$lte``, ``$gt``,
  ``$gte`` (values of another type never match), ``$all``, and a top-level
  ``$or``;
* updates: ``$set``, ``$unset``, ``$inc``, ``$push`` with ``$each`` and a
  negative ``$slice``;
* sorts on top-level fields, a missing field first;
* exclusion projections.

Anything else raises ``NotImplementedError``: a statement the memory store
cannot apply fails its tests rather than being applied wrongly. Stored
values are kept as BSON keeps them: times to the millisecond.

Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import cmp_to_key
from typing import Any

Document = dict[str, Any]
_MISSING = object()


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """Whether ``doc`` matches the filter ``query``."""
    for name, condition in query.items():
        if name == "$or":
            if not any(matches(doc, branch) for branch in condition):
                return False
            continue
        if name.startswith("$"):
            raise NotImplementedError(f"query operator {name}")
        if not _field_matches(_lookup(doc, name), condition):
            return False
    return True


def _lookup(doc: Mapping[str, Any], name: str) -> Any:
    """A field by its dotted path (``http.host``), or _MISSING."""
    value: Any = doc
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _field_matches(value: Any, condition: Any) -> bool:
    if isinstance(condition, Mapping) and any(str(k).startswith("$") for k in condition):
        return all(_operator(value, op, operand) for op, operand in condition.items())
    return _equals(value, condition)


def _equals(value: Any, wanted: Any) -> bool:
    if wanted is None:
        return value is _MISSING or value is None
    if value is _MISSING:
        return False
    if isinstance(value, list) and not isinstance(wanted, list):
        return any(_same(item, wanted) for item in value)
    return _same(value, wanted)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1 in Python, not in BSON
        return type(a) is type(b) and a == b
    return bool(a == b)


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return _equals(value, operand)
    if op == "$exists":
        return (value is not _MISSING) == bool(operand)
    if op == "$in":
        return any(_equals(value, candidate) for candidate in operand)
    if op == "$nin":  # a null in the list excludes a missing field too
        return not any(_equals(value, candidate) for candidate in operand)
    if op == "$all":
        return isinstance(value, list) and all(_equals(value, item) for item in operand)
    if op in _ORDERS:
        if value is _MISSING or value is None or not _comparable(value, operand):
            return False
        return bool(_ORDERS[op](value, operand))
    raise NotImplementedError(f"query operator {op}")


_ORDERS: dict[str, Callable[[Any, Any], bool]] = {
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
}


def _comparable(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return not isinstance(a, bool) and not isinstance(b, bool)
    return type(a) is type(b) or (isinstance(a, datetime) and isinstance(b, datetime))


def apply(doc: Document, update: Mapping[str, Any]) -> None:
    """Apply the update ``update`` to ``doc`` in place."""
    for op, fields in update.items():
        for name, value in fields.items():
            if "." in name:
                raise NotImplementedError(f"a dotted path in an update: {name}")
            if op == "$set":
                doc[name] = stored(value)
            elif op == "$unset":
                doc.pop(name, None)
            elif op == "$inc":
                doc[name] = doc.get(name, 0) + value
            elif op == "$push":
                doc[name] = _pushed(doc.get(name), value)
            else:
                raise NotImplementedError(f"update operator {op}")


def _pushed(current: Any, spec: Any) -> list[Any]:
    items = list(current or [])
    if isinstance(spec, Mapping) and "$each" in spec:
        items.extend(stored(v) for v in spec["$each"])
        keep = spec.get("$slice")
        if keep is not None:
            if keep > 0:
                raise NotImplementedError("a positive $slice")
            items = items[max(0, len(items) + keep) :]
        return items
    items.append(stored(spec))
    return items


def stored(value: Any) -> Any:
    """``value`` as the store keeps it: a copy of its containers (no caller
    shares a stored document), times to the millisecond (BSON's precision)."""
    if isinstance(value, dict):
        return {k: stored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [stored(v) for v in value]
    if isinstance(value, datetime):
        return value.replace(microsecond=value.microsecond // 1000 * 1000)
    return value


def project(doc: Document, projection: Mapping[str, int] | None) -> Document:
    """A copy of ``doc`` as ``projection`` shapes it: the fields an
    exclusion projection names removed, or only ``_id`` and those an
    inclusion projection names (a mix of both is not MongoDB's either)."""
    copy: Document = stored(doc)
    if projection and any(projection.values()):
        if not all(projection.values()):
            raise NotImplementedError("a projection both including and excluding")
        return {name: value for name, value in copy.items() if name == "_id" or name in projection}
    for name in projection or {}:
        copy.pop(name, None)
    return copy


def sort(docs: list[Document], order: Sequence[tuple[str, int]]) -> list[Document]:
    """``docs`` in ``order`` (field, 1 or -1), a missing field first."""

    def compare(a: Document, b: Document) -> int:
        for name, direction in order:
            x, y = a.get(name), b.get(name)
            if x == y:
                continue
            if x is None or (y is not None and x < y):
                return -direction
            return direction
        return 0

    return sorted(docs, key=cmp_to_key(compare))
