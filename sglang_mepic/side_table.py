"""What this package keeps about SGLang's objects, beside them rather than on them.

SGLang's request objects are its own: an attribute set on one is invisible to a reader of
the class, travels wherever SGLang copies or pickles the object, and can collide with a
field SGLang adds later. A `SideTable` holds the value by the object's identity for as long
as the object lives (a weakref finalizer drops the entry), and works for objects that are
unhashable (SGLang's request dataclasses compare by value).
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

V = TypeVar("V")


class SideTable(Generic[V]):
    def __init__(self, name: str):
        self.name = name  # for a reader of a heap dump or a debugger
        self._values: dict[int, V] = {}

    def set(self, obj: object, value: V) -> None:
        key = id(obj)
        if key not in self._values:
            # Runs before the object's memory (and so its id) can be reused.
            weakref.finalize(obj, self._values.pop, key, None)
        self._values[key] = value

    def get(self, obj: object, default: V | None = None) -> V | None:
        return self._values.get(id(obj), default)

    def __contains__(self, obj: object) -> bool:
        return id(obj) in self._values
