"""The LiteLLM callback (pipeline.gateways.litellm) with a real ``litellm.Router`` of two deployments.

The upstreams are a local OpenAI-compatible server (pipeline.tools.fake_openai) that fails on cue: HTTP 500,
401, 429 with Retry-After, slow streams. The events the callback publishes are caught by a stub publisher
(the Kafka path has its own test: tests/integration/test_gateway_litellm_kafka.py) and checked field by field.
Each test fails on the code before this module existed (no pipeline.gateways).
"""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price list at import
litellm = pytest.importorskip("litellm", reason="the [litellm] extra is not installed")

from pipeline.contracts import RequestEvent  # noqa: E402
from pipeline.gateways.litellm import ChannelHealthLogger, retry_after_s_from_headers  # noqa: E402
from pipeline.tools.fake_openai import COMPLETION_TOKENS, PROMPT_TOKENS, FakeOpenAI  # noqa: E402

IN_COST, OUT_COST = 1e-6, 2e-6  # USD per token, set on both deployments so LiteLLM prices them


class Collect:
    """A publisher stub: keeps every offered event."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def offer(self, event: dict) -> bool:
        self.events.append(event)
        return True


@pytest.fixture()
def server():
    with FakeOpenAI(retry_after_s=7, gap_s=0.4, ttft_s=0.05) as srv:
        yield srv


def _router(srv: FakeOpenAI, **kwargs):
    deployments = [
        {"model_name": "chat",
         "litellm_params": {"model": "openai/gpt-a", "api_base": srv.base_url("a"), "api_key": "sk-test-a",
                            "input_cost_per_token": IN_COST, "output_cost_per_token": OUT_COST},
         "model_info": {"id": "dep-a", "channel": "prov-a/gpt@paid", "account": "acct-a", "tier": "paid"}},
        {"model_name": "chat",
         "litellm_params": {"model": "openai/gpt-b", "api_base": srv.base_url("b"), "api_key": "sk-test-b",
                            "input_cost_per_token": IN_COST, "output_cost_per_token": OUT_COST},
         "model_info": {"id": "dep-b"}},
    ]
    return litellm.Router(model_list=deployments, **{"num_retries": 0, "disable_cooldowns": True, **kwargs})


#: What each deployment's events must say about where they come from.
WHERE = {
    "prov-a/gpt@paid": {"route": "chat", "account": "acct-a", "tier": "paid"},
    # no model_info channel/account: litellm_params["model"] and the API key's fingerprint (sha256("sk-test-b")[:12])
    "openai/gpt-b": {"route": "chat", "account": "key-" + __import__("hashlib").sha256(b"sk-test-b").hexdigest()[:12]},
}


@pytest.fixture()
def logger():
    sink = Collect()
    cb = ChannelHealthLogger(publisher=sink, gateway_id="gw-1")
    saved = litellm.callbacks
    litellm.callbacks = [cb]
    yield cb, sink
    litellm.callbacks = saved


def _check_common(e: dict) -> None:
    assert e["channel"] in WHERE, e
    for k, v in WHERE[e["channel"]].items():
        assert e[k] == v, (k, e)
    if e["channel"] == "openai/gpt-b":
        assert "tier" not in e
    assert e["gateway_id"] == "gw-1"
    assert e["event_id"].startswith("litellm:") and len(e["event_id"]) > 20
    assert e["latency_ms"] >= 0
    msgspec.convert(e, RequestEvent)  # every event meets the contract (SPEC §3)


async def _call(router, n: int = 1, **kwargs) -> list:
    out = []
    for _ in range(n):
        try:
            out.append(await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}], **kwargs))
        except Exception as exc:  # the failures are the point
            out.append(exc)
    await asyncio.sleep(0)  # LiteLLM schedules its logging as tasks
    return out


def run(coro):
    return asyncio.run(coro)


async def _settle(sink: Collect, n: int) -> None:
    """Wait (bounded) until ``n`` events were logged: LiteLLM runs its logging in tasks after the call returns."""
    for _ in range(500):
        if len(sink.events) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(sink.events)} events logged, expected {n}")


def test_success_carries_tokens_cost_and_deployment_fields(server, logger):
    cb, sink = logger

    async def main():
        router = _router(server)
        await _call(router, 6)
        await _settle(sink, 6)

    run(main())
    assert len(sink.events) == 6  # one event per upstream call
    assert {e["channel"] for e in sink.events} == set(WHERE)  # 6 shuffled calls reach both (p of one side 1/32)
    for e in sink.events:
        _check_common(e)
        assert e["status"] == "ok" and e["http_status"] == 200
        assert e["input_tokens"] == PROMPT_TOKENS and e["output_tokens"] == COMPLETION_TOKENS
        assert e["cost_usd"] == pytest.approx(PROMPT_TOKENS * IN_COST + COMPLETION_TOKENS * OUT_COST)  # LiteLLM's
        assert "ttft_ms" not in e and "max_stream_gap_ms" not in e and "error_class" not in e
    assert cb.published_events == 6 and cb.errors == 0


@pytest.mark.parametrize("mode, status, http, error_type, error_class, text", [
    ("error_500", "error", 500, "InternalServerError", "transient", "upstream exploded"),
    ("error_401", "error", 401, "AuthenticationError", "credential", "Incorrect API key provided"),
    ("error_429", "rate_limited", 429, "RateLimitError", "rate_limited", "Rate limit reached"),
])
def test_failures_carry_status_class_message_and_retry_after(server, logger, mode, status, http, error_type,
                                                             error_class, text):
    cb, sink = logger
    server.set_mode("a", mode)
    server.set_mode("b", mode)

    async def main():
        router = _router(server)
        results = await _call(router, 4)
        assert all(isinstance(r, Exception) for r in results)  # the gateway's own behaviour is unchanged
        await _settle(sink, 4)

    run(main())
    assert len(sink.events) == 4
    for e in sink.events:
        _check_common(e)
        assert (e["status"], e["http_status"], e["error_type"], e["error_class"]) == (status, http, error_type,
                                                                                      error_class)
        assert text in e["error_message"] and len(e["error_message"]) <= 512
        if http == 429:
            assert e["retry_after_s"] == 7.0  # the upstream's Retry-After header
        else:
            assert "retry_after_s" not in e
        assert "input_tokens" not in e and "cost_usd" not in e


def test_retries_publish_one_event_per_attempt(server, logger):
    cb, sink = logger
    server.set_mode("a", "error_500")
    server.set_mode("b", "error_500")

    async def main():
        router = _router(server, num_retries=2, retry_after=0)
        await _call(router, 1)
        await _settle(sink, 3)

    run(main())
    calls = server.calls("a") + server.calls("b")
    assert calls == 3  # the first try and two retries
    assert len(sink.events) == calls
    assert len({e["event_id"] for e in sink.events}) == calls  # one id per attempt
    assert all(e["http_status"] == 500 for e in sink.events)


def test_slow_stream_carries_ttft_and_max_gap(server, logger):
    cb, sink = logger
    server.set_mode("a", "slow_stream")
    server.set_mode("b", "slow_stream")

    async def main():
        router = _router(server)
        for _ in range(2):
            stream = await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}],
                                              stream=True, stream_options={"include_usage": True})
            text = "".join([(c.choices[0].delta.content or "") async for c in cb.timed(stream) if c.choices])
            assert text.startswith("ok from ")
        await _settle(sink, 2)

    run(main())
    for e in sink.events:
        _check_common(e)
        assert e["status"] == "ok"
        assert e["output_tokens"] == 4 and e["input_tokens"] == PROMPT_TOKENS  # the stream's usage chunk
        # the server pauses 0.05 s before the first chunk and 0.4 s between chunks: the longest gap is about one
        # pause. Chunks are timed where the caller reads them, so LiteLLM's own work per chunk (and a busy
        # machine: two test processes share two cores) moves each arrival by tens of ms; the bounds are half a
        # pause and three pauses, far from a stream without pauses (a few ms).
        assert 200 <= e["max_stream_gap_ms"] < 1200
        assert 50 <= e["ttft_ms"] < e["latency_ms"]
        assert e["latency_ms"] >= 50 + 3 * 400  # three pauses between four chunks


def test_stream_without_timing_still_has_ttft(server, logger):
    cb, sink = logger
    server.set_mode("a", "slow_stream")
    server.set_mode("b", "slow_stream")

    async def main():
        router = _router(server)
        stream = await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
        async for _ in stream:
            pass
        await _settle(sink, 1)

    run(main())
    (e,) = sink.events
    assert e["ttft_ms"] >= 50 and "max_stream_gap_ms" not in e


def test_sync_router_calls_publish_through_the_sync_hooks(server, logger):
    cb, sink = logger
    router = _router(server)
    router.completion(model="chat", messages=[{"role": "user", "content": "hi"}])
    server.set_mode("a", "error_401")
    server.set_mode("b", "error_401")
    with pytest.raises(litellm.AuthenticationError):
        router.completion(model="chat", messages=[{"role": "user", "content": "hi"}])
    for _ in range(500):
        if len(sink.events) >= 2:
            break
        __import__("time").sleep(0.01)
    assert [e["status"] for e in sink.events] == ["ok", "error"]
    assert sink.events[1]["error_class"] == "credential"


def test_a_failing_publisher_never_fails_the_request(server):
    class Broken:
        def offer(self, event):
            raise RuntimeError("kafka client exploded")

    cb = ChannelHealthLogger(publisher=Broken())
    saved = litellm.callbacks
    litellm.callbacks = [cb]
    try:
        async def main():
            router = _router(server)
            results = await _call(router, 3)
            for _ in range(500):
                if cb.errors >= 3:
                    break
                await asyncio.sleep(0.01)
            return results

        results = run(main())
    finally:
        litellm.callbacks = saved
    assert all(r.choices[0].message.content == "ok" for r in results)
    assert cb.errors == 3 and cb.published_events == 0


def test_classifier_none_leaves_the_class_to_the_worker(server):
    sink = Collect()
    cb = ChannelHealthLogger(publisher=sink, classifier=None)
    saved = litellm.callbacks
    litellm.callbacks = [cb]
    server.set_mode("a", "error_401")
    server.set_mode("b", "error_401")
    try:
        async def main():
            await _call(_router(server), 1)
            await _settle(sink, 1)

        run(main())
    finally:
        litellm.callbacks = saved
    assert "error_class" not in sink.events[0] and sink.events[0]["http_status"] == 401


@pytest.mark.parametrize("headers, expected", [
    ({"retry-after": "7"}, 7.0),
    ({"Retry-After": "2.5"}, 2.5),
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
    ({"retry-after": "Thu, 01 Jan 1970 00:01:00 GMT"}, 30.0),  # an HTTP date, 30 s after now_s=30
    ({"retry-after": "999999"}, 86_400.0),
    ({"retry-after": "-3"}, 0.0),
    ({"retry-after": "soon"}, None),
    ({}, None),
    (None, None),
])
def test_retry_after_parsing(headers, expected):
    assert retry_after_s_from_headers(headers, now_s=30.0) == expected


def test_proxy_streaming_iterator_hook_times_the_chunks(server, logger):
    # The LiteLLM proxy passes each streamed response through async_post_call_streaming_iterator_hook
    # (litellm/proxy/common_request_processing.py); here the router's stream goes through it the same way.
    cb, sink = logger
    server.set_mode("a", "slow_stream")
    server.set_mode("b", "slow_stream")

    async def main():
        router = _router(server)
        stream = await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
        request_data = {"litellm_call_id": stream.logging_obj.litellm_call_id}
        async for _ in cb.async_post_call_streaming_iterator_hook(None, stream, request_data):
            pass
        await _settle(sink, 1)

    run(main())
    (e,) = sink.events
    assert 200 <= e["max_stream_gap_ms"] < 1200 and e["ttft_ms"] >= 50  # bounds as in the SDK test above
