"""Webhook payloads of a :class:`~pipeline.alert.grouping.Notification`, one function per format.

Every message carries, per channel: the channel, route, state, reasons with
the numbers behind them, the weight, the error class behind them when there is one
(:func:`~pipeline.alert.error_class_text.error_class_line`: "dead key on account acct-a
(2 channels) — <the provider's message>"), and the SQL that shows its history in
ClickHouse (``channel-health query "..."``). :func:`payload` picks the
function by the route's ``format``.

Names are data, never markup (SPEC §8): every text a gateway chose (channel,
route, reasons, metric keys) passes the format's own escaper from
:mod:`pipeline.escape` (``slack_text``, ``im_markdown``, ``feishu_text``,
``terminal_text`` for JSON and PagerDuty text), so a channel named
``<!channel>`` or ``[click](https://evil)`` pings nobody and links nowhere;
the history SQL holds the name as an escaped literal
(:func:`~pipeline.escape.sql_literal`). The error-class line holds the provider's
message (SPEC §4.1) and the account, both gateway or provider text: escaped the same way.
Structured fields (``details``)
keep the raw values: JSON encoding is already safe.
"""

from __future__ import annotations

from typing import Any, Callable

from pipeline.alert.config import Route
from pipeline.alert.error_class_text import error_class_line
from pipeline.alert.grouping import Notification
from pipeline.contracts import Verdict
from pipeline.escape import feishu_text, im_markdown, slack_text, sql_literal, terminal_text

Escaper = Callable[[Any], str]

#: Metrics shown per channel at most (the rest stay in ClickHouse).
MAX_METRICS = 8


def history_sql(channel: str) -> str:
    """SQL listing the channel's last 50 verdicts (``channel_health.channel_verdicts``, SPEC §7).

    The name is a :func:`~pipeline.escape.sql_literal`: it selects exactly ``channel`` and is inert inside an
    IM message's code span (no backtick, ``<``, ``>``, ``&`` or control character).
    """
    return ("SELECT ts, state, weight, reasons, metrics FROM channel_health.channel_verdicts "
            f"WHERE channel = {sql_literal(channel)} ORDER BY ts DESC LIMIT 50")


def channel_line(v: Verdict, since_ms: int | None = None, policy: Any = None) -> str:
    """What is wrong with ``v`` in people's numbers and what happens next (unescaped; issue #35).

    ``state, weight``; for a forced state who forced it (key id) and why; each reason rendered by
    :func:`pipeline.alert.reasons.render_reason` (value, line or baseline, sample size); then ``next: ...``
    (:func:`pipeline.alert.reasons.next_step`). ``since_ms``: event time the state began (None: unknown);
    ``policy``: a :class:`~pipeline.policy.defaults.PolicyConfig` (default: the defaults).
    """
    from pipeline.alert.reasons import next_probe_ms, next_step, override_text, render_reasons

    if policy is None:
        from pipeline.policy.defaults import PolicyConfig

        policy = PolicyConfig()
    override = v.override if isinstance(v.override, dict) else None
    head = f"state {v.state}, weight {v.weight:g}"
    rendered = "; ".join(render_reasons(v.reasons, v.metrics))
    if override:
        head += f", {override_text(override)}"
        rendered = f"detectors: {rendered or 'nothing found'}"
    nxt = next_step(v.state, since_ms, policy.open_cooldown_ms, policy.half_open_observe_ms, override,
                    next_probe_ms(v))
    return f"{head}; {rendered or 'no reason given'}; next: {nxt}"


def title(n: Notification, esc: Escaper = terminal_text) -> str:
    """One line: ``[CRITICAL] route chat: 3 channels firing`` / ``[RESOLVED] route chat: all channels healthy``.

    ``esc``: the medium's escaper (:mod:`pipeline.escape`), applied to the route and the title text.
    """
    if n.title:
        return f"[{'RESOLVED' if n.kind == 'resolved' else esc(n.severity.upper())}] {esc(n.title)}"
    if n.kind == "resolved":
        return f"[RESOLVED] route {esc(n.route)}: all channels healthy again"
    return f"[{esc(n.severity.upper())}] route {esc(n.route)}: {len(n.firing)} channel(s) firing"


def lines(n: Notification, esc: Escaper = terminal_text, bold: str = "**") -> list[str]:
    """Body lines (markdown): one block per channel (its line, its error-class line when a class is behind
    the verdict, its history SQL), then resolved channels.

    ``esc``: the medium's escaper for every gateway-chosen text; ``bold``: the medium's bold marker
    (``**``, Slack's ``*``, or none for plain text).
    """
    out = [esc(n.detail)] if n.detail else []
    since = dict(n.since_ms)
    for v, sev in n.firing:
        out.append(f"- {bold}{esc(v.channel)}{bold} ({esc(sev)}) route {esc(v.route)}: "
                   f"{esc(channel_line(v, since.get(v.channel)))}")
        cls = error_class_line(v.reasons, v.metrics)
        if cls:
            out.append(f"  {esc(cls)}")
        out.append(f"  history: `{history_sql(v.channel)}`")
    for v in n.resolved:
        out.append(f"- resolved: {bold}{esc(v.channel)}{bold} route {esc(v.route)}: state {esc(v.state)}, "
                   f"weight {v.weight:g}")
    return out


def text(n: Notification, esc: Escaper = terminal_text, bold: str = "**") -> str:
    """Title and body as one markdown text (``esc``, ``bold``: as :func:`lines`)."""
    return "\n".join([title(n, esc), *lines(n, esc, bold)])


def details(n: Notification) -> dict[str, Any]:
    """Structured form: kind, severity, route and per channel the verdict fields plus ``history_sql`` and
    ``error_class_text`` (:func:`~pipeline.alert.error_class_text.error_class_line`, raw; None: no class)."""
    def one(v: Verdict, sev: str | None) -> dict[str, Any]:
        return {"channel": v.channel, "route": v.route, "state": v.state, "weight": v.weight, "reasons": v.reasons,
                "metrics": v.metrics, "ts_ms": v.ts_ms, "seq": v.seq, "severity": sev,
                "history_sql": history_sql(v.channel), "error_class_text": error_class_line(v.reasons, v.metrics)}

    return {"kind": n.kind, "key": n.key, "route": n.route, "severity": n.severity, "title": title(n),
            "detail": n.detail, "firing": [one(v, s) for v, s in n.firing],
            "resolved": [one(v, None) for v in n.resolved]}


def as_json(n: Notification, route: Route) -> dict[str, Any]:
    """Generic JSON: :func:`details` plus ``text``."""
    return {**details(n), "text": text(n)}


def as_slack(n: Notification, route: Route) -> dict[str, Any]:
    """Slack incoming webhook (api.slack.com/messaging/webhooks): ``{"text", "blocks": [section mrkdwn]}``.

    ``text`` is the notification fallback; Slack's mrkdwn bolds with single ``*``. Names:
    :func:`~pipeline.escape.slack_text`.
    """
    body = "\n".join(lines(n, slack_text, "*")) or " "
    head = title(n, slack_text)
    return {"text": head,
            "blocks": [{"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
                       {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}}]}


def as_feishu(n: Notification, route: Route) -> dict[str, Any]:
    """Feishu/Lark custom bot (open.feishu.cn "Custom bot usage guide"): ``{"msg_type": "text", "content": {"text"}}``.

    Plain text, no bold; names: :func:`~pipeline.escape.feishu_text` (no ``<at>`` tag can open).
    """
    return {"msg_type": "text", "content": {"text": text(n, feishu_text, "")}}


def as_dingtalk(n: Notification, route: Route) -> dict[str, Any]:
    """DingTalk custom robot (open.dingtalk.com, "Custom robot"): ``{"msgtype": "markdown", "markdown": {"title", "text"}}``.

    Names: :func:`~pipeline.escape.im_markdown`; no ``at`` object is sent, so nobody is mentioned.
    """
    head = title(n, im_markdown)
    body = "\n".join(lines(n, im_markdown))
    return {"msgtype": "markdown", "markdown": {"title": head, "text": f"### {head}\n\n{body}"}}


def as_wecom(n: Notification, route: Route) -> dict[str, Any]:
    """WeCom group robot (developer.work.weixin.qq.com/document/path/91770): ``{"msgtype": "markdown", "markdown": {"content"}}``.

    WeCom refuses markdown content over 4096 bytes; the text is cut to fit. Names:
    :func:`~pipeline.escape.im_markdown` (no ``<@userid>`` mention, no ``<font>``, no link).
    """
    content = text(n, im_markdown).encode("utf-8")[:4000].decode("utf-8", "ignore")
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
                        "component": terminal_text(n.route), "custom_details": details(n)}}


FORMATTERS: dict[str, Callable[[Notification, Route], dict[str, Any]]] = {
    "json": as_json, "slack": as_slack, "feishu": as_feishu, "dingtalk": as_dingtalk, "wecom": as_wecom,
    "pagerduty": as_pagerduty,
}


def payload(n: Notification, route: Route) -> dict[str, Any]:
    """The JSON body for ``route`` (its ``format``); KeyError for an unknown format (the config refuses those)."""
    return FORMATTERS[route.format](n, route)
