"""A small TOML writer for the sandbox's ``slurm-gpu.toml``.

The standard library reads TOML (tomllib) but cannot write it, and the
config holds only tables of strings, numbers, booleans and lists, so a
dependency is not worth it.  JSON string escapes are valid TOML basic-string
escapes, which is why strings go through ``json.dumps``.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x, where)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML ({where})")


def dumps(sections: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """``{"node": {"snapshot": "..."}}`` -> ``[node]\\nsnapshot = "..."``."""
    out: list[str] = [f"# {line}" for line in header.splitlines()]
    for name, table in sections.items():
        if out:
            out.append("")
        out.append(f"[{_key(name)}]")
        for k, v in table.items():
            out.append(f"{_key(k)} = {_value(v, f'{name}.{k}')}")
    return "\n".join(out) + "\n"
