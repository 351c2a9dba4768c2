"""The compiled core's read-only views of its four lists (``policy.t1`` and
so on), over the methods it gives them (``_list_len`` and the rest). The
twins' lists are their own ``OrderedDict``s, as vLLM's are."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

# Names of the four lists, in the order the compiled core numbers them.
LIST_NAMES = ("t1", "t2", "b1", "b2")


class _ListSource(Protocol):
    def _list_len(self, which: int) -> int: ...
    def _list_contains(self, which: int, key: Any) -> bool: ...
    def _list_getitem(self, which: int, key: Any) -> Any: ...
    def _list_iter(self, which: int) -> Iterator[tuple[Any, Any]]: ...


_V = TypeVar("_V")


class ListView(Mapping[Any, _V], Generic[_V]):
    """Read-only, ordered view of one ARC list (LRU first).

    Values are the ChunkStatus objects for t1/t2 and None for b1/b2.
    """

    __slots__ = ("_policy", "_which")

    def __init__(self, policy: _ListSource, which: int) -> None:
        self._policy = policy
        self._which = which

    def __len__(self) -> int:
        return self._policy._list_len(self._which)

    def __contains__(self, key: object) -> bool:
        return self._policy._list_contains(self._which, key)

    def __getitem__(self, key: Any) -> _V:
        return self._policy._list_getitem(self._which, key)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Any]:
        for key, _ in self._policy._list_iter(self._which):
            yield key

    def items(self) -> ItemsView[Any, _V]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"{LIST_NAMES[self._which]}({list(self.keys())!r})"


class _Items(ItemsView[Any, _V]):
    __slots__ = ()

    def __iter__(self) -> Iterator[tuple[Any, _V]]:
        view: ListView[_V] = self._mapping  # type: ignore[attr-defined]  # ItemsView's, untyped
        return view._policy._list_iter(view._which)
