"""Site configuration: one TOML file, one section per area.

Looked up like ClusterShell does: ``$SLURM_GPU_CONFIG``, then
``/etc/slurm-gpu/slurm-gpu.toml``, then ``<venv>/etc/slurm-gpu/slurm-gpu.toml``.
No file found means all defaults, and so does a missing file at the default
path when it is named (the plugstack line's ``config=``, or
``$SLURM_GPU_CONFIG``): the packages ship it, and an admin who deletes it
gets the defaults it lists.  Any other named file that is missing is an error:
that name is a site's own file, and running without it would silently drop
its settings.  Each area (``[mps]``, ``[mig]``,
``[health]``...) owns a dataclass of settings and builds it with
:func:`section`, which rejects unknown keys: a typo in a root-run config must
be an error, not a silently ignored setting.
"""
from __future__ import annotations

import math
import os
import sys
from functools import lru_cache

from . import hostctx
from .errors import InputError

# Not typing's TYPE_CHECKING, and tomllib and functools only where used: the
# prolog and epilog take their settings from the node-fact cache
# (:mod:`slurm_gpu.jobs.settings`), and these imports (with re, enum,
# datetime) cost each run ~12 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, TypeVar

    T = TypeVar("T")

ENV_VAR = "SLURM_GPU_CONFIG"
DEFAULT_PATH = "/etc/slurm-gpu/slurm-gpu.toml"   # the packages' conffile
MAX_NUMBER = 10 ** 9        # no timeout, count or percentage is bigger

def use_config(path: str | None) -> None:
    """Make *path* the config file for this process (None: back to the lookup).

    For code hosted inside another program (the SPANK plugin in slurmstepd),
    which must not putenv(); see :mod:`slurm_gpu.hostctx`.
    """
    hostctx.config_file = path


def config_path() -> Path | None:
    """The config file in effect, or None when only defaults apply."""
    p = config_file()
    if p is None:
        return None
    from pathlib import Path
    return Path(p)


def config_file() -> str | None:
    """:func:`config_path` as a string.  Settings are read through this one:
    pathlib (with urllib.parse and ipaddress, ~2.5 ms) is no part of a
    health-check run."""
    if hostctx.config_file:
        return hostctx.config_file
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    for cand in (DEFAULT_PATH, os.path.join(sys.prefix, "etc", "slurm-gpu", "slurm-gpu.toml")):
        if os.path.isfile(cand):
            return cand
    return None


@lru_cache(maxsize=8)
def _load(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    import tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        if path == DEFAULT_PATH:        # named, but the default: see the module docstring
            return {}
        raise InputError("config file not found", path) from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"bad config: {e}", path) from None
    except UnicodeDecodeError:
        raise InputError("bad config: not UTF-8 text", path) from None
    except RecursionError:
        raise InputError("bad config: nested too deeply", path) from None
    except ValueError as e:             # tomllib's int() of a 4,300+ digit number
        raise InputError(f"bad config: {str(e)[:80]}", path) from None
    except OSError as e:
        raise InputError(f"cannot read config: {e.strerror}", path) from None


def clear_cache() -> None:
    """Forget every config file read so far: the next read sees each file as it is now.

    A file is parsed once per process (hooks and checks read their sections
    many times); code that changes which file is in effect, or the file
    itself, within one process calls this (:func:`config_sections.validate`,
    tests).
    """
    _load.cache_clear()


def load_raw(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The whole parsed config as a dict (empty when there is no file)."""
    if path is None:
        path = config_file()
    return _load(os.fspath(path) if path is not None else None)


class Settings:
    """A config section's settings: the annotated class attributes, with their
    values as defaults, settable by keyword and mutable, compared by value.

    What ``@dataclass`` gave the prolog's sections, without importing
    dataclasses (and inspect, ast, dis: ~5 ms of every prolog).
    """

    def __init__(self, **kw: Any) -> None:
        names = field_names(type(self))
        for k in kw:
            if k not in names:
                raise TypeError(f"{type(self).__name__}: unknown setting {k!r}")
        for k in names:
            setattr(self, k, kw[k] if k in kw else getattr(type(self), k))
        post = getattr(self, "__post_init__", None)
        if post is not None:            # as a dataclass calls it: defaults, checks
            post()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in field_names(type(self)))
        return f"{type(self).__name__}({args})"


def field_names(cls: type) -> tuple[str, ...]:
    """The settings names of *cls*: a dataclass's fields, a :class:`Settings`'
    annotated attributes, or a ``Plain``'s slots."""
    if hasattr(cls, "__dataclass_fields__"):
        import dataclasses              # loaded already: cls is one
        return tuple(f.name for f in dataclasses.fields(cls))
    if issubclass(cls, Settings):
        cached = cls.__dict__.get("_field_names_")
        if cached is None:
            names: dict[str, None] = {}
            for c in reversed(cls.__mro__):
                for k, ann in c.__dict__.get("__annotations__", {}).items():
                    if not str(ann).startswith(("ClassVar", "typing.ClassVar")):
                        names[k] = None
            cached = tuple(names)
            setattr(cls, "_field_names_", cached)
        return cached
    return tuple(getattr(cls, "__slots__", ()))


def section(cls: type[T], name: str, raw: dict[str, Any] | None = None) -> T:
    """Build settings *cls* (a dataclass, :class:`Settings` or ``Plain``) from config section *name*.

    Unknown keys and values of the wrong type are errors naming the key.
    """
    if raw is None:
        raw = load_raw()
    data = raw.get(name, {})
    where = f"[{name}] in {config_file() or 'config'}"
    if not isinstance(data, dict):
        raise InputError(f"section {name} must be a table", where)
    fields = field_names(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise InputError(f"unknown config key {name}.{unknown[0]}", where)
    defaults = cls()  # type: ignore[call-arg]
    for key, value in data.items():
        want = type(getattr(defaults, key))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value) if abs(value) <= MAX_NUMBER else value
        if getattr(defaults, key) is not None and (not isinstance(value, want) or
                                                   (want is not bool and isinstance(value, bool))):
            raise InputError(f"config key {name}.{key} must be {want.__name__}", where)
        if want in (int, float) and not (math.isfinite(value) and 0 <= value <= MAX_NUMBER):
            # Every number here is a duration, a count or a percentage: TOML's
            # nan/inf or a negative one would only fail later, in a timer or a loop.
            raise InputError(f"config key {name}.{key} must be a finite number from 0 to {MAX_NUMBER}", where)
        data = {**data, key: value}
    return cls(**data)  # type: ignore[call-arg]
