"""Unit tests live in one directory per product layer (``paths.UNIT_LAYERS``).

pytest imports each test module under its basename (its default ``prepend``
import mode), so basenames stay unique across layers; a test module imports
another's helpers by that name (``from test_health_drain import FakeSlurm``)
and the shared fakes here (``nvmlfake``, ``kmsgfake``, ``fuzzlib``) likewise,
wherever either lives: every layer directory is on ``sys.path``.
"""
from __future__ import annotations

import sys

from paths import UNIT, UNIT_LAYERS

for _d in [UNIT, *(UNIT / layer for layer in UNIT_LAYERS)]:
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
