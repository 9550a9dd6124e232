"""Payload formats and HTTP delivery of alerts: a real aiohttp server on loopback, no sleeps in backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from aiohttp import web

from pipeline.alert.config import parse_alert_config
from pipeline.alert.delivery import Dispatcher
from pipeline.alert.formats import history_sql, payload
from pipeline.alert.grouping import Notification
from pipeline.contracts import Verdict

V = Verdict(channel="lepton/llama-70b@free", route="chat", state="open", weight=0.0,
            reasons=["error_rate"], metrics={"error_rate_1m": 0.12, "error_n_1m": 340, "p95_ratio": 1.1},
            ts_ms=1_750_000_000_000, seq=7)
FIRING = Notification("firing", "channel-health/chat", "chat", "critical", firing=((V, "critical"),))
RESOLVED = Notification("resolved", "channel-health/chat", "chat", "info", resolved=(V,))


def route(fmt: str, **extra) -> object:
    raw = {"name": fmt, "url": "http://127.0.0.1:1/x", "format": fmt, **extra}
    if fmt == "pagerduty":
        raw["routing_key"] = "R" * 32
    return parse_alert_config({"route": [raw]}, env={}).routes[0]


def test_slack_payload_has_the_incoming_webhook_shape() -> None:
    body = payload(FIRING, route("slack"))
    assert set(body) == {"text", "blocks"} and body["text"] == "[CRITICAL] route chat: 1 channel(s) firing"
    header, section = body["blocks"]
    assert header == {"type": "header", "text": {"type": "plain_text", "text": body["text"]}}
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    assert "*lepton/llama-70b@free* (critical) route chat: state open, weight 0" in section["text"]["text"]
    # issue #35: reasons in people's numbers, not "error_rate_1m=0.12"
    assert "error rate 12 % last minute; next: next probe" in section["text"]["text"]
    assert history_sql(V.channel) in section["text"]["text"]


def test_pagerduty_payload_matches_events_api_v2() -> None:
    trigger = payload(FIRING, route("pagerduty"))
    assert set(trigger) == {"routing_key", "event_action", "dedup_key", "payload"}
    assert (trigger["routing_key"], trigger["event_action"], trigger["dedup_key"]) == \
        ("R" * 32, "trigger", "channel-health/chat")
    p = trigger["payload"]
    assert {"summary", "source", "severity", "custom_details"} <= set(p)
    assert p["severity"] in {"critical", "error", "warning", "info"} and p["severity"] == "critical"
    assert p["custom_details"]["firing"][0]["history_sql"] == \
        "SELECT ts, state, weight, reasons, metrics FROM channel_health.channel_verdicts " \
        "WHERE channel = 'lepton/llama-70b@free' ORDER BY ts DESC LIMIT 50"
    assert payload(RESOLVED, route("pagerduty")) == {"routing_key": "R" * 32, "event_action": "resolve",
                                                      "dedup_key": "channel-health/chat"}


def test_im_bot_payloads_have_their_documented_shapes() -> None:
    feishu = payload(FIRING, route("feishu"))
    assert feishu["msg_type"] == "text" and feishu["content"]["text"].startswith("[CRITICAL] route chat")
    ding = payload(FIRING, route("dingtalk"))
    assert ding["msgtype"] == "markdown" and set(ding["markdown"]) == {"title", "text"}
    wecom = payload(FIRING, route("wecom"))
    assert wecom["msgtype"] == "markdown" and set(wecom["markdown"]) == {"content"}
    generic = payload(RESOLVED, route("json"))
    assert (generic["kind"], generic["resolved"][0]["channel"], generic["text"].splitlines()[0]) == \
        ("resolved", V.channel, "[RESOLVED] route chat: all channels healthy again")
    assert history_sql("a'b") == ("SELECT ts, state, weight, reasons, metrics FROM channel_health.channel_verdicts "
                                  "WHERE channel = 'a\\'b' ORDER BY ts DESC LIMIT 50")


class Hooks:
    """A loopback web server: ``/ok``, ``/fail`` (500), ``/bad`` (400), ``/bot-error`` (200 with errcode)."""

    def __init__(self) -> None:
        self.received: dict[str, list] = {}

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.received.setdefault(name, []).append(await request.json())
        if name == "fail":
            return web.Response(status=500)
        if name == "bad":
            return web.Response(status=400)
        if name == "bot-error":
            return web.json_response({"errcode": 310000, "errmsg": "keywords not in content"})
        return web.json_response({"ok": True})


@contextlib.asynccontextmanager
async def serve():
    """:class:`Hooks` listening on a free loopback port (``.base`` is its URL)."""
    h = Hooks()
    app = web.Application()
    app.router.add_post("/{name}", h.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    h.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield h
    finally:
        await runner.cleanup()


def run_with_hooks(body):
    """Run ``body(hooks)`` (a coroutine function) on a fresh event loop beside the server; returns the hooks."""
    async def main():
        async with serve() as h:
            await body(h)
            return h
    return asyncio.run(main())


def config(base: str, primary: str, **extra):
    return parse_alert_config({"route": [
        {"name": "im", "url": f"{base}/{primary}", "format": "slack", "backup": "pager2", "attempts": 3, **extra},
        {"name": "pager2", "url": f"{base}/ok", "format": "pagerduty", "routing_key": "k" * 32,
         "backup_only": True}]}, env={})


def test_primary_answering_500_is_retried_then_the_backup_gets_the_alert(caplog) -> None:
    waits = []

    async def no_sleep(s: float) -> None:
        waits.append(s)

    async def body(hooks):
        async with Dispatcher(config(hooks.base, "fail", backoff_s=1.0), sleep=no_sleep, rng=lambda: 1.0) as d:
            assert await d.dispatch(FIRING) == ["pager2"]
            assert await d.dispatch(RESOLVED) == ["pager2"]  # the resolve follows the same way
        assert d.counters.backup_used == 2 and d.counters.sent == {"pager2": 2}

    with caplog.at_level(logging.WARNING, "channel_health.alert"):
        hooks = run_with_hooks(body)
    assert len(hooks.received["fail"]) == 3 * 2 and waits == [1.0, 2.0, 1.0, 2.0]  # backoff doubles
    assert [b["event_action"] for b in hooks.received["ok"]] == ["trigger", "resolve"]
    assert hooks.base not in caplog.text and "attempt 3/3 failed: HTTP 500" in caplog.text


@pytest.mark.parametrize("primary", ["bad", "bot-error"])
def test_refusals_are_not_retried(primary: str) -> None:
    async def body(hooks):
        async with Dispatcher(config(hooks.base, primary)) as d:
            assert await d.dispatch(FIRING) == ["pager2"]

    assert len(run_with_hooks(body).received[primary]) == 1


def test_unreachable_route_without_backup_fails_with_its_name_only(caplog) -> None:
    cfg = parse_alert_config({"route": [{"name": "im", "url": "http://127.0.0.1:9/hook?token=s3cr3t-token",
                                         "format": "json", "attempts": 2, "backoff_s": 0.01}]}, env={})

    async def body():
        async with Dispatcher(cfg) as d:
            assert await d.dispatch(FIRING) == []
        return d

    with caplog.at_level(logging.WARNING, "channel_health.alert"):
        d = asyncio.run(body())
    assert d.counters.failed == 1 and "alert route im failed" in caplog.text and "s3cr3t" not in caplog.text


def test_rate_limit_per_route_drops_firing_but_not_resolves() -> None:
    now = [0.0]

    async def body(hooks):
        cfg = parse_alert_config({"route": [{"name": "im", "url": f"{hooks.base}/ok", "format": "json",
                                             "max_per_hour": 2, "min_severity": "info"}]}, env={})
        async with Dispatcher(cfg, clock=lambda: now[0]) as d:
            results = [await d.dispatch(FIRING) for _ in range(3)]
            assert results == [["im"], ["im"], []] and d.counters.rate_limited == 1
            assert await d.dispatch(RESOLVED) == ["im"]
            now[0] = 3600.0
            assert await d.dispatch(FIRING) == ["im"]

    assert len(run_with_hooks(body).received["ok"]) == 4


def test_routes_are_chosen_by_severity_and_verdict_route() -> None:
    cfg = parse_alert_config({"route": [
        {"name": "im", "url": "http://h/ok", "format": "json", "min_severity": "warning"},
        {"name": "pager", "url": "http://h/ok", "format": "json", "min_severity": "critical"},
        {"name": "batch-only", "url": "http://h/ok", "format": "json", "match_routes": ["batch-*"]}]}, env={})
    warning = Notification("firing", "channel-health/chat", "chat", "warning", firing=((V, "warning"),))
    heartbeat = Notification("firing", "channel-health/heartbeat", "*", "critical", title="pipeline silent")
    d = Dispatcher(cfg)
    assert [r.name for r in d.targets(warning)] == ["im"]
    assert [r.name for r in d.targets(FIRING)] == ["im", "pager"]
    assert [r.name for r in d.targets(heartbeat)] == ["im", "pager", "batch-only"]
    assert [r.name for r in d.targets(RESOLVED)] == ["im", "pager"]  # where its alert went


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_the_backup_gets_the_alert(status: int, caplog) -> None:
    """Issue #30: aiohttp followed a 307/308 to another host and re-POSTed the PagerDuty routing key there."""
    key = "K" * 32
    elsewhere: list[tuple[str, str, bytes]] = []  # (method, path, body) of every request the other server gets

    async def record(request: web.Request) -> web.Response:
        elsewhere.append((request.method, request.path, await request.read()))
        return web.json_response({"status": "success"})

    async def main():
        other = web.Application()
        other.router.add_route("*", "/{tail:.*}", record)
        other_runner = web.AppRunner(other)
        await other_runner.setup()
        await web.TCPSite(other_runner, "127.0.0.1", 0).start()
        target = f"http://127.0.0.1:{other_runner.addresses[0][1]}/v2/enqueue"

        async def redirect(request: web.Request) -> web.Response:
            hits.append(await request.json())
            return web.Response(status=status, headers={"Location": target})

        hits: list[dict] = []
        try:
            async with serve() as hooks:
                redirector = web.Application()
                redirector.router.add_post("/enqueue", redirect)
                runner = web.AppRunner(redirector)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                try:
                    cfg = parse_alert_config({"route": [
                        {"name": "pager", "url": f"http://127.0.0.1:{runner.addresses[0][1]}/enqueue",
                         "format": "pagerduty", "routing_key": key, "backup": "im2", "attempts": 3},
                        {"name": "im2", "url": f"{hooks.base}/ok", "format": "json", "backup_only": True}]}, env={})
                    async with Dispatcher(cfg) as d:
                        assert await d.dispatch(FIRING) == ["im2"]
                finally:
                    await runner.cleanup()
        finally:
            await other_runner.cleanup()
        return d, hits, hooks

    with caplog.at_level(logging.WARNING, "channel_health.alert"):
        d, hits, hooks = asyncio.run(main())
    assert elsewhere == []  # the redirect's target received nothing: no request, no routing key
    assert [h["routing_key"] for h in hits] == [key]  # one attempt: a redirect is not retried
    assert d.counters.failed == 1 and d.counters.backup_used == 1 and d.counters.sent == {"im2": 1}
    assert len(hooks.received["ok"]) == 1
    assert f"attempt 1/3 failed: HTTP {status}: the webhook answered with a redirect, which is not followed" \
        in caplog.text and "alert route pager failed" in caplog.text and "/v2/enqueue" not in caplog.text
