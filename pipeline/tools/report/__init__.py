"""``channel-health report``: one self-contained HTML incident report from ClickHouse (issue #21).

- :mod:`.data`: the read-only queries and the window (``--from/--to``, ``--incident``)
- :mod:`.plots`: the matplotlib plots (PNG)
- :mod:`.html`: the page (plots embedded, no network)

:func:`write_report` ties them together; ``pipeline.cli.report`` is the command.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from pipeline.config import QueryLimits
from pipeline.tools.extras import require_extra


def write_report(client: Any, out: Path, source: str, *, channel: str | None = None, route: str | None = None,
                 t0: datetime | None = None, t1: datetime | None = None, incident: bool = False,
                 limits: QueryLimits | None = None, on_data: Callable[[Any], None] | None = None) -> Path:
    """Read the data (:func:`.data.load_report_data`), render it and write ``out``; returns its absolute path.

    ``source``: where the data came from, shown in the header (pass a redacted URL: it is printed as is).
    Raises :class:`.data.ReportError` for a bad selection or no data, the query errors, ``OSError``
    when ``out`` cannot be written, and :class:`~pipeline.tools.extras.MissingExtra` without matplotlib.
    ``on_data``: called with the :class:`.data.ReportData` read, before rendering.
    """
    require_extra("matplotlib", "channel-health report")
    from pipeline.tools.report.data import load_report_data
    from pipeline.tools.report.html import render_html

    data = load_report_data(client, channel=channel, route=route, t0=t0, t1=t1, incident=incident, limits=limits)
    if on_data is not None:  # e.g. the command prints the window it resolved
        on_data(data)
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(data, source), encoding="utf-8")
    return out
