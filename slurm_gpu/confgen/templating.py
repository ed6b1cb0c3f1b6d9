"""jinja2 environment for the config templates in ``templates/``.

StrictUndefined makes a missing view-model field an error instead of an
empty string in a config file; templates receive finished data only.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping


@lru_cache(maxsize=1)
def _env() -> Any:
    import jinja2

    from ..paths import resource_dir

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True)


def render(template: str, variables: Mapping[str, Any]) -> str:
    """Render ``templates/<template>`` with *variables*.

    The view models hand over checked values (:mod:`.confsafe`); the text
    is checked once more as a whole, so no template can put a character
    outside printable ASCII (a line break Slurm or a reader would see) into
    a config file.
    """
    from .confsafe import check_text
    return check_text(_env().get_template(template).render(**variables), template.removesuffix(".j2"))
