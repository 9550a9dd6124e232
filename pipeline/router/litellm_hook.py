"""Channel-health shares as a ``litellm.Router`` routing strategy (optional extra ``litellm``; issue #20 item 3).

LiteLLM lets a router delegate the choice of deployment to a
``litellm.types.router.CustomRoutingStrategyBase`` (docs: "Custom routing
strategy"; ``Router.set_custom_routing_strategy``, ``register_plugin`` in
newer releases). :class:`ChannelHealthStrategy` picks among the deployments
of the requested ``model_name`` at random, in proportion to their channels'
shares from a :class:`~pipeline.router.table.HealthTable` (the engine's
bounded ``route_share``, overrides honoured: :func:`~pipeline.router.table.
route_shares`). Feed the table with a
:class:`~pipeline.router.subscriber.HealthSubscriber` (its ``.table``).

Mapping: a deployment's channel is ``model_info["channel"]`` when set, else
its ``litellm_params["model"]`` (pass ``channel_of`` to map otherwise).

Rules:

- an ``open`` channel (share 0) gets no traffic;
- a channel with a learned capacity cap (``metrics.max_share``, SPEC §4.2) stays at most at its cap when
  the shares are re-normalised over the model group (a route channel outside it, a deployment without
  a verdict): the excess goes to the group's uncapped deployments (:func:`~pipeline.router.table.keep_caps`);
- stale verdicts: the table's last known shares (fail-static), never equal shares;
- a deployment whose channel has no verdict yet counts as healthy with an
  equal share of its model group (k deployments: 1/k) before normalising;
- every channel at share 0: :class:`AllChannelsOpen` is raised, so LiteLLM's
  own ``fallbacks`` take over (the router's fallback rule, not ours).

Usage::

    from litellm import Router
    router = Router(model_list=[...])
    install(router, subscriber.table)
"""

from __future__ import annotations

import logging
import random
from typing import Any, Callable

try:
    from litellm.types.router import CustomRoutingStrategyBase
except ImportError as exc:  # an optional extra: say which, instead of a bare "No module named litellm"
    raise ImportError("pipeline.router.litellm_hook needs LiteLLM, an optional extra: "
                      "pip install 'channel-health[litellm]' (or pip install litellm)") from exc

from pipeline.router.table import HealthTable, keep_caps

log = logging.getLogger("channel_health.litellm")


class AllChannelsOpen(RuntimeError):
    """Every deployment of the requested model is on an open channel (LiteLLM fallbacks apply)."""


def default_channel_of(deployment: dict) -> str:
    """``model_info["channel"]`` when present, else ``litellm_params["model"]``."""
    info = deployment.get("model_info") or {}
    return str(info.get("channel") or deployment["litellm_params"]["model"])


class ChannelHealthStrategy(CustomRoutingStrategyBase):
    """Weighted random choice of a deployment by channel-health shares.

    ``router``: the ``litellm.Router`` (its ``model_list`` is read per call, so
    deployments added later count). ``table``: the shares. ``channel_of``:
    deployment dict -> channel name. ``rng``: random source (tests).
    """

    def __init__(self, router: Any, table: HealthTable, channel_of: Callable[[dict], str] = default_channel_of,
                 rng: random.Random | None = None) -> None:
        self.router, self.table, self.channel_of = router, table, channel_of
        self.rng = rng or random.Random()

    def shares(self, model: str) -> list[tuple[dict, float]]:
        """``(deployment, weight)`` of the deployments of ``model`` (weights sum 1).

        Raises ``ValueError`` for a model with no deployment and
        :class:`AllChannelsOpen` when every weight is 0.
        """
        deployments = [d for d in self.router.model_list if d.get("model_name") == model]
        if not deployments:
            raise ValueError(f"no deployment for model {model!r}")
        k = len(deployments)
        weights, caps = [], {}
        for j, d in enumerate(deployments):
            channel = self.channel_of(d)
            v = self.table.verdict(channel)
            if v is None:
                weights.append(1.0 / k)  # no verdict yet: healthy, an equal share
                continue
            rw = self.table.weights(v.route)
            weights.append(rw.shares.get(channel, 0.0))
            if (cap := rw.max_shares.get(channel)) is not None:
                caps[str(j)] = cap
        total = sum(weights)
        if total <= 0:
            raise AllChannelsOpen(f"every channel of model {model!r} is open per channel-health")
        out = {str(j): w / total for j, w in enumerate(weights)}
        if caps:  # SPEC §4.2: re-normalised over the model group, a capped channel stays at its max_share
            out = keep_caps(out, caps)
        return [(d, out[str(j)]) for j, d in enumerate(deployments)]

    def get_available_deployment(self, model: str, messages: list | None = None, input: Any = None,
                                 specific_deployment: bool | None = False,
                                 request_kwargs: dict | None = None) -> dict:
        """One deployment of ``model`` drawn by share (raises as :meth:`shares`)."""
        pairs = self.shares(model)
        x = self.rng.random()
        for d, w in pairs:
            x -= w
            if x < 0:
                return d
        return next(d for d, w in reversed(pairs) if w > 0)  # rounding at the top end

    async def async_get_available_deployment(self, model: str, messages: list | None = None, input: Any = None,
                                             specific_deployment: bool | None = False,
                                             request_kwargs: dict | None = None) -> dict:
        """As :meth:`get_available_deployment` (no I/O: the table is in memory)."""
        return self.get_available_deployment(model, messages, input, specific_deployment, request_kwargs)


def install(router: Any, table: HealthTable, **kwargs: Any) -> ChannelHealthStrategy:
    """Make ``router`` pick deployments with a :class:`ChannelHealthStrategy`; returns it.

    Uses ``router.register_plugin`` where LiteLLM has it (newer releases, where
    ``set_custom_routing_strategy`` is deprecated), else ``set_custom_routing_strategy``.
    """
    strategy = ChannelHealthStrategy(router, table, **kwargs)
    register = getattr(router, "register_plugin", None) or router.set_custom_routing_strategy
    register(strategy)
    return strategy
