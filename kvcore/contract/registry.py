"""`Registry[T]`: one way to name the interchangeable parts of a run.

Policies, placements, eviction orders, latency models, admission modes, host write policies,
queue orders and preemption modes are each chosen by a name on the command line. Each kind
keeps its entries in one `Registry`, so every kind answers the same three questions the same
way (register, get, names) and an unknown name is the same one-line `ValueError` naming the
known ones. Entries keep their registration order: that is the order users see them listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Named entries of one kind (`what`, e.g. "policy": the word an error uses)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def add(self, name: str, item: T, when: str = "") -> T:
        """Register `item` under `name`; `when` is the one-line "pick it when" users see.
        A name registered twice is a bug (two parts would answer to one option value)."""
        if not name or name != name.strip():
            raise ValueError(f"a {self.what} name must be non-empty without spaces around, "
                             f"got {name!r}")
        if name in self._items and self._items[name] is not item:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._items[name] = item
        self._help[name] = when
        return item

    def register(self, name: str, when: str = "") -> Callable[[T], T]:
        """`add` as a decorator (on a class or a factory)."""

        def deco(item: T) -> T:
            return self.add(name, item, when)

        return deco

    def get(self, name: str) -> T:
        """The entry named `name`; an unknown name is one line listing the known ones."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.what} {name!r}; known: "
                             f"{', '.join(self._items)}") from None

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._items)

    def help(self) -> dict[str, str]:
        """name -> its "pick it when" line."""
        return dict(self._help)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
