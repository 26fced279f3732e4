"""Make ``import knowledge`` find the package even though this test folder has the same name.

pytest (prepend import mode) puts ``tests/`` on ``sys.path`` for the top-level conftest, and the
editable install's import hook runs after the path search, so ``tests/knowledge/`` would be
found first as an empty namespace package. Putting the repository root on the path lets the
path search find the real package (same fix as ``tests/templates/conftest.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
_stale = sys.modules.get("knowledge")
if _stale is not None and getattr(_stale, "__file__", None) is None:
    for _name in [name for name in sys.modules if name.split(".")[0] == "knowledge"]:
        del sys.modules[_name]
