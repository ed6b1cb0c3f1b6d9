"""A base for small immutable value classes that are cheap to define.

Making a dataclass costs a few hundred microseconds (it generates and
compiles methods); the GPU interface's values and the node sources are
defined on every health check, inventory and prolog run, so they use this
instead: fields from ``__slots__``, positional or keyword construction,
equality, hashing and a readable repr.
"""
from __future__ import annotations


TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Plain:
    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kw: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} arguments")
        values = dict(zip(names, args))
        for k, v in kw.items():
            if k not in names or k in values:
                raise TypeError(f"{type(self).__name__}: bad or repeated argument {k!r}")
            values[k] = v
        defaults = getattr(type(self), "_defaults", {})
        for k in names:
            if k not in values:
                if k not in defaults:
                    raise TypeError(f"{type(self).__name__} needs {k!r}")
                values[k] = defaults[k]
            object.__setattr__(self, k, values[k])

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values() == self._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(repr(v) for v in self._values())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({args})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")
