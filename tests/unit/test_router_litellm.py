"""LiteLLM routing hook (issue #20 item 3) with LiteLLM's mock deployments (``mock_response``: no network)."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price map at import
litellm = pytest.importorskip("litellm", reason="litellm is not installed (optional extra: pip install '.[litellm]')")

from pipeline.contracts import Verdict  # noqa: E402
from pipeline.router.litellm_hook import AllChannelsOpen, install  # noqa: E402
from pipeline.router.table import HealthTable  # noqa: E402

T0 = 1_700_000_000_000


class Clock:
    now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def deployment(channel: str) -> dict:
    return {"model_name": "chat-70b",
            "litellm_params": {"model": f"openai/{channel}", "api_key": "sk-test", "mock_response": f"from {channel}"},
            "model_info": {"id": channel, "channel": channel}}


def v(channel: str, state: str, weight: float, share: float, seq: int) -> Verdict:
    return Verdict(channel=channel, route="chat-70b", state=state, weight=weight, reasons=[],
                   metrics={"route_share": share}, ts_ms=T0 + seq * 30_000, seq=seq)


async def answers(router, n: int) -> Counter:
    got = Counter()
    for _ in range(n):
        r = await router.acompletion(model="chat-70b", messages=[{"role": "user", "content": "hi"}])
        got[r.choices[0].message.content] += 1
    return got


def test_open_channel_gets_no_traffic_and_stale_keeps_last_shares() -> None:
    clock = Clock()
    table = HealthTable(stale_after_s=90, clock=clock)
    router = litellm.Router(model_list=[deployment("primary"), deployment("backup")])
    strategy = install(router, table, rng=random.Random(7))
    table.update(v("primary", "open", 0.0, 0.0, 1))
    table.update(v("backup", "healthy", 1.0, 1.0, 1))
    assert asyncio.run(answers(router, 20)) == Counter({"from backup": 20})

    table.update(v("primary", "recovering", 0.4, 0.25, 2))  # the engine's bounded share, not 0.4 / 1.4
    table.update(v("backup", "healthy", 1.0, 0.75, 2))
    clock.now_s = 500.0  # verdicts stop: stale, the last shares stay
    assert table.weights("chat-70b").stale
    assert [round(w, 3) for _, w in strategy.shares("chat-70b")] == [0.25, 0.75]
    got = asyncio.run(answers(router, 200))
    assert got["from primary"] + got["from backup"] == 200 and 30 <= got["from primary"] <= 70


def test_all_open_raises_for_litellm_fallbacks_and_unknown_channels_count_equal() -> None:
    table = HealthTable(stale_after_s=90)
    router = litellm.Router(model_list=[deployment("primary"), deployment("backup")])
    strategy = install(router, table)
    assert [w for _, w in strategy.shares("chat-70b")] == [0.5, 0.5]  # no verdicts yet
    table.update(v("primary", "open", 0.0, 0.0, 1))
    table.update(v("backup", "open", 0.0, 0.0, 1))
    with pytest.raises(AllChannelsOpen, match="chat-70b"):
        strategy.get_available_deployment("chat-70b")


def test_a_capped_channel_stays_at_its_max_share_over_a_smaller_model_group() -> None:
    # SPEC §4.2: the hook re-normalises the route's shares over the model group's deployments. Route
    # chat-70b has a third channel (share 0.25) outside this group; the backup is capped at 0.5 and holds
    # 0.5. Normalised over the group alone the backup would get 0.5 / 0.75 = 0.667 (the code before);
    # held to its cap it gets 0.5 and the primary the excess: 0.5.
    table = HealthTable(stale_after_s=90, clock=Clock())
    router = litellm.Router(model_list=[deployment("primary"), deployment("backup")])
    strategy = install(router, table, rng=random.Random(7))
    table.update(v("primary", "recovering", 0.4, 0.25, 1))
    table.update(Verdict(channel="backup", route="chat-70b", state="degraded", weight=0.5,
                         reasons=["over_capacity"], metrics={"route_share": 0.5, "max_share": 0.5},
                         ts_ms=T0 + 30_000, seq=1))
    table.update(v("third", "healthy", 1.0, 0.25, 1))
    assert [(d["model_info"]["channel"], round(w, 6)) for d, w in strategy.shares("chat-70b")] == [
        ("primary", 0.5), ("backup", 0.5)]
