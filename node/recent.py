"""A mapping that keeps at most a fixed number of entries, forgetting the
least recently used first: what a node keeps per caller-chosen name (an API
key, a tenant, a filter) must not grow with what callers make up."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The entry, now the most recently used; None if not kept."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)
