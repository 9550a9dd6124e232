"""``channel-health demo --keep``: leave the demo's stack up to try the other commands (issue #35 part 5).

After the replay the broker and the worker stay up until Ctrl-C (or SIGTERM). :func:`keep_lines` prints
the exports another shell needs and the commands to try: ``watch`` (live state from ``channel.health``;
the worker holds the chDB directory, so the board says its history panels are off), ``override``,
``alert --once``, ``simulate`` for more traffic. ``query`` and ``report`` read chDB, which one process may
open at a time: they work after Ctrl-C, when the demo also prints its summary and report as usual.
"""

from __future__ import annotations

import shlex
import time
from typing import Callable

from pipeline.config import Settings

#: How often the kept stack checks that its worker still runs (s).
CHECK_EVERY_S = 1.0


def keep_lines(settings: Settings, channel: str | None, scenario: str) -> list[str]:
    """The lines :func:`keep_up` prints: exports (shell-quoted) and commands to try on ``channel``
    (a channel of the replay; a placeholder when None) and ``scenario`` (for more traffic)."""
    q = shlex.quote
    ch = q(channel) if channel else "CHANNEL"
    exports = [f"export CHANNEL_HEALTH_KAFKA_BOOTSTRAP={q(settings.kafka_bootstrap or '')}",
               f"export CHANNEL_HEALTH_CLICKHOUSE_URL={q(settings.clickhouse_url)}"]
    if settings.topic_prefix:
        exports.append(f"export CHANNEL_HEALTH_TOPIC_PREFIX={q(settings.topic_prefix)}")
    return ["", "The stack stays up (demo --keep): broker and worker run until Ctrl-C. In another shell:", "",
            *(f"  {e}" for e in exports), "",
            "  channel-health watch                      # the live board (history panels: after Ctrl-C)",
            f"  channel-health override set {ch} --open --ttl 5m --reason 'trying an override'",
            "  channel-health override list              # what is in force, as the worker applies it",
            f"  channel-health override clear {ch}",
            "  channel-health alert --config infra/alerts.example.toml --once   # needs the webhooks it names",
            f"  channel-health simulate --scenario {q(scenario)} --speed 200       # more traffic",
            "", "query and report read the chDB directory the worker holds: run them after Ctrl-C.",
            "Press Ctrl-C to stop the stack."]


def keep_up(say: Callable[[str], None], check: Callable[[], None], lines: list[str],
            sleep: Callable[[float], None] = time.sleep) -> None:
    """Print ``lines`` and return on Ctrl-C (``KeyboardInterrupt``); ``check()`` every :data:`CHECK_EVERY_S`
    raises when the worker died (its error propagates)."""
    for line in lines:
        say(line)
    try:
        while True:
            check()
            sleep(CHECK_EVERY_S)
    except KeyboardInterrupt:
        say("Stopping the kept stack…")
