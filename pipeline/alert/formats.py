"""Webhook payloads of a :class:`~pipeline.alert.grouping.Notification`, one function per format.

Every message carries, per channel: the channel, route, state, reasons with
the numbers behind them, the weight, and the SQL that shows its history in
ClickHouse (``channel-health query "..."``). :func:`payload` picks the
function by the route's ``format``.
"""

from __future__ import annotations

from typing import Any, Callable

from pipeline.alert.config import Route
from pipeline.alert.grouping import Notification
from pipeline.contracts import Verdict

#: Metrics shown per channel at most (the rest stay in ClickHouse).
MAX_METRICS = 8


def history_sql(channel: str) -> str:
    """SQL listing the channel's last 50 verdicts (``channel_health.channel_verdicts``, SPEC §7)."""
    quoted = channel.replace("\\", "\\\\").replace("'", "\\'")
    return ("SELECT ts, state, weight, reasons, metrics FROM channel_health.channel_verdicts "
            f"WHERE channel = '{quoted}' ORDER BY ts DESC LIMIT 50")


def _numbers(v: Verdict) -> str:
    """``key=value`` of the metrics behind the reasons (keys sharing a reason's first word first)."""
    stems = {r.split("_")[0] for r in v.reasons}
    items = [(k, x) for k, x in v.metrics.items() if x is not None]
    items.sort(key=lambda kv: (kv[0].split("_")[0] not in stems, kv[0]))
    return ", ".join(f"{k}={x:g}" if isinstance(x, float) else f"{k}={x}" for k, x in items[:MAX_METRICS])


def title(n: Notification) -> str:
    """One line: ``[CRITICAL] route chat: 3 channels firing`` / ``[RESOLVED] route chat: all channels healthy``."""
    if n.title:
        return f"[{'RESOLVED' if n.kind == 'resolved' else n.severity.upper()}] {n.title}"
    if n.kind == "resolved":
        return f"[RESOLVED] route {n.route}: all channels healthy again"
    return f"[{n.severity.upper()}] route {n.route}: {len(n.firing)} channel(s) firing"


def lines(n: Notification) -> list[str]:
    """Body lines (markdown): one block per channel, then resolved channels."""
    out = [n.detail] if n.detail else []
    for v, sev in n.firing:
        out.append(f"- **{v.channel}** ({sev}) route {v.route}: state {v.state}, weight {v.weight:g}, "
                   f"reasons {', '.join(v.reasons) or '-'}; {_numbers(v) or 'no metrics'}")
        out.append(f"  history: `{history_sql(v.channel)}`")
    for v in n.resolved:
        out.append(f"- resolved: **{v.channel}** route {v.route}: state {v.state}, weight {v.weight:g}")
    return out


def text(n: Notification) -> str:
    """Title and body as one markdown text."""
    return "\n".join([title(n), *lines(n)])


def details(n: Notification) -> dict[str, Any]:
    """Structured form: kind, severity, route and per channel the verdict fields plus ``history_sql``."""
    def one(v: Verdict, sev: str | None) -> dict[str, Any]:
        return {"channel": v.channel, "route": v.route, "state": v.state, "weight": v.weight, "reasons": v.reasons,
                "metrics": v.metrics, "ts_ms": v.ts_ms, "seq": v.seq, "severity": sev,
                "history_sql": history_sql(v.channel)}

    return {"kind": n.kind, "key": n.key, "route": n.route, "severity": n.severity, "title": title(n),
            "detail": n.detail, "firing": [one(v, s) for v, s in n.firing],
            "resolved": [one(v, None) for v in n.resolved]}


def as_json(n: Notification, route: Route) -> dict[str, Any]:
    """Generic JSON: :func:`details` plus ``text``."""
    return {**details(n), "text": text(n)}


def as_slack(n: Notification, route: Route) -> dict[str, Any]:
    """Slack incoming webhook (api.slack.com/messaging/webhooks): ``{"text", "blocks": [section mrkdwn]}``.

    ``text`` is the notification fallback; Slack's mrkdwn bolds with single ``*``.
    """
    body = "\n".join(lines(n)).replace("**", "*") or " "
    return {"text": title(n),
            "blocks": [{"type": "header", "text": {"type": "plain_text", "text": title(n)[:150]}},
                       {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}}]}


def as_feishu(n: Notification, route: Route) -> dict[str, Any]:
    """Feishu/Lark custom bot (open.feishu.cn "Custom bot usage guide"): ``{"msg_type": "text", "content": {"text"}}``."""
    return {"msg_type": "text", "content": {"text": text(n).replace("**", "")}}


def as_dingtalk(n: Notification, route: Route) -> dict[str, Any]:
    """DingTalk custom robot (open.dingtalk.com, "Custom robot"): ``{"msgtype": "markdown", "markdown": {"title", "text"}}``."""
    return {"msgtype": "markdown", "markdown": {"title": title(n), "text": f"### {title(n)}\n\n" + "\n".join(lines(n))}}


def as_wecom(n: Notification, route: Route) -> dict[str, Any]:
    """WeCom group robot (developer.work.weixin.qq.com/document/path/91770): ``{"msgtype": "markdown", "markdown": {"content"}}``.

    WeCom refuses markdown content over 4096 bytes; the text is cut to fit.
    """
    content = text(n).encode("utf-8")[:4000].decode("utf-8", "ignore")
    return {"msgtype": "markdown", "markdown": {"content": content}}


def as_pagerduty(n: Notification, route: Route) -> dict[str, Any]:
    """PagerDuty Events API v2 (developer.pagerduty.com "Send an Alert Event").

    ``{"routing_key", "event_action": "trigger"|"resolve", "dedup_key", "payload": {"summary", "source",
    "severity", "custom_details"}}``; a resolve needs only ``routing_key``, ``event_action`` and ``dedup_key``.
    Severities map to PagerDuty's ``critical``/``warning``/``info``; ``summary`` is at most 1024 characters.
    """
    if n.kind == "resolved":
        return {"routing_key": route.routing_key, "event_action": "resolve", "dedup_key": n.key}
    return {"routing_key": route.routing_key, "event_action": "trigger", "dedup_key": n.key,
            "payload": {"summary": title(n)[:1024], "source": "channel-health", "severity": n.severity,
                        "component": n.route, "custom_details": details(n)}}


FORMATTERS: dict[str, Callable[[Notification, Route], dict[str, Any]]] = {
    "json": as_json, "slack": as_slack, "feishu": as_feishu, "dingtalk": as_dingtalk, "wecom": as_wecom,
    "pagerduty": as_pagerduty,
}


def payload(n: Notification, route: Route) -> dict[str, Any]:
    """The JSON body for ``route`` (its ``format``); KeyError for an unknown format (the config refuses those)."""
    return FORMATTERS[route.format](n, route)
