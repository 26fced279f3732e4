"""Make ``import templates`` find the package even though this test folder has the same name.

pytest (prepend import mode) puts ``tests/`` on ``sys.path`` for the top-level conftest; the
package itself is installed editable through an import hook that runs after the path search,
so ``tests/templates/`` would be picked up as an empty namespace package called ``templates``.
Putting the repository root on the path lets the path search find the real package first.
(A ``pythonpath = ["."]`` entry in the pytest configuration would do the same for all areas.)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
_stale = sys.modules.get("templates")
if _stale is not None and getattr(_stale, "__file__", None) is None:
    for _name in [name for name in sys.modules if name.split(".")[0] == "templates"]:
        del sys.modules[_name]
