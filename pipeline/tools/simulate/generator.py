"""The event-time request generator behind :meth:`Scenario.events`.

Time advances in blocks of ``block_s`` seconds of scenario time (default
10 s; no sleeping). Per block and route:

1. Arrivals: per second, ``Poisson(peak_rps x load_factor(t) x burst(t))``
   requests (:mod:`.load`), uniformly spread inside the second.
2. Assignment: each request goes to a channel of the route with probability
   proportional to the shares (``shares(route, ts_ms_of_block_start)`` if a
   callback is given, else the route's static shares). Channels whose
   traffic is suppressed (``consecutive_failures`` window) are skipped.
3. Outcomes per channel (:mod:`.faults`): failure probability = baseline +
   ramps + overload (load = 30 s average of the channel's request rate),
   1.0 in an outage; latency = healthy sample x day/night multiplier x
   fault factor x overload factor; structured answers turn hollow with the
   injected missing rate.
   Channels with ``chat_share`` send free-text answers (MT-bench pool,
   :mod:`.chat_answers`) with ``prompt_text``; a ``quality_drift`` fault
   turns a share of them useless (refusal, truncated, off-topic) while the
   status and latency stay as they are. Text choices use a random stream
   of their own per channel, so adding text leaves every other number of
   the run unchanged.
4. Retries (routes with ``retry_failures``): each failed first attempt is
   retried once, 50 ms after it finished, on another channel of the route.

Scheduled events (``consecutive_failures`` failures and real-provider
replays) are added to the block of their arrival. An event's ``ts_ms`` is
when it *finished* (arrival + latency); events are buffered and yielded in
non-decreasing ``ts_ms`` order once no later block can produce an earlier one.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from bisect import bisect_left
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

import numpy as np

from .answers import AnswerBank, load_answer_bank
from .chat_answers import ChatAnswer, load_chat_pool
from .channels import FAILURE_HTTP, FAILURE_KINDS, LOAD_TAU_S, ChannelProfile, LatencyModel, RouteSpec
from .faults import Effects, Fault, channel_effects, overload_factors
from .load import DiurnalCurve
from .replay import REPLAY_HTTP, ReplayChannel
from .run_state import (
    _STATUS_INDEX,
    ERROR_LATENCY_SHARE,
    GATEWAY_IDS,
    OVERLOAD_MIX,
    RATE_LIMITED_LATENCY_MS,
    RETRY_DELAY_S,
    STATUS_NAMES,
    _Block,
    _ChannelRun,
    _Detail,
    _mix_pick,
    event_id_prefix,
)
from .traces import load_azure_trace, load_llmperf
from .usage_faults import QUOTA_ERROR_TYPE, QUOTA_HTTP, apply_usage_faults, cost_factor

if TYPE_CHECKING:  # pragma: no cover
    from .scenarios import Scenario

SharesFn = Callable[[str, int], Mapping[str, float]]

class Generator:
    """One run of a scenario; iterate :meth:`events`."""

    def __init__(
        self,
        scenario: "Scenario",
        start_ms: int,
        seed: int = 0,
        shares: SharesFn | None = None,
        *,
        data_dir: str | Path | None = None,
        block_s: int = 10,
    ) -> None:
        if not isinstance(start_ms, (int, np.integer)) or isinstance(start_ms, bool):
            raise TypeError(f"start_ms must be an int (epoch ms), got {type(start_ms).__name__}")
        if int(block_s) < 1:
            raise ValueError(f"block_s must be >= 1, got {block_s}")
        self.sc = scenario
        self.start_ms = int(start_ms)
        self.seed = int(seed)
        self.shares_fn = shares
        self.block_s = int(block_s)
        self.data_dir = data_dir if data_dir is not None else scenario.data_dir
        self.curve = DiurnalCurve(scenario.start_hour, scenario.night_fraction, scenario.latency_swing)
        name_key = int.from_bytes(hashlib.blake2b(scenario.name.encode(), digest_size=4).digest(), "big")
        root = np.random.SeedSequence([self.seed, name_key])
        profiles = [c for c in scenario.channels if isinstance(c, ChannelProfile)]
        self.replays = [c for c in scenario.channels if isinstance(c, ReplayChannel)]
        seqs = root.spawn(len(scenario.routes) + len(profiles))
        self.route_rng = {r.name: np.random.default_rng(s) for r, s in zip(scenario.routes, seqs)}
        self.bursts = {r.name: scenario.burst_envelope(r.name, self.data_dir) for r in scenario.routes}
        self.bank: AnswerBank | None = (
            load_answer_bank(self.data_dir) if any(p.structured_share > 0 for p in profiles) else None
        )
        # Spawned after the streams above, so those are the same with or without text.
        text_seqs = root.spawn(len(profiles))
        self.chat_pool: tuple[ChatAnswer, ...] | None = (
            load_chat_pool(self.data_dir) if any(p.chat_share > 0 for p in profiles) else None
        )
        routes = {r.name: r for r in scenario.routes}
        self.runs: dict[str, _ChannelRun] = {}
        for p, s in zip(profiles, seqs[len(scenario.routes):]):
            route = routes[p.route]
            det = _Detail()
            base = [det.add("ok", 200, None)]
            for kind in FAILURE_KINDS:
                http, et = FAILURE_HTTP[kind]
                base.append(det.add(kind, http, et))
            my_faults = tuple(f for f in scenario.faults if f.channel == p.name)
            outage_detail = [
                det.add(
                    f.params.get("status", "error"),
                    f.params.get("http_status", 503),
                    f.params.get("error_type", "upstream_unavailable"),
                    f.params.get("error_message"),
                    f.params.get("retry_after_s"),
                )
                for f in my_faults
                if f.kind == "outage"
            ]
            self.runs[p.name] = _ChannelRun(
                profile=p,
                route=route,
                latency=LatencyModel.from_llmperf(load_llmperf(p.latency_source, self.data_dir), p.latency_ms, p.latency_quantile),
                trace=load_azure_trace(route.trace, self.data_dir),
                rng=np.random.default_rng(s),
                faults=my_faults,
                detail=det,
                base_detail=np.array(base, dtype=np.int64),
                outage_detail=outage_detail,
                caller_detail=[(f, det.add("error", f.params.get("http_status", 400),
                                           f.params.get("error_type", "context_length_exceeded"),
                                           f.params.get("error_message")))
                               for f in my_faults if f.kind == "caller_errors"],
                base_mix=p.base_failure_mix,
                text_rng=np.random.default_rng(text_seqs[len(self.runs)]) if p.chat_share > 0 else None,
            )
        # Stalls, quota, cost (:mod:`.usage_faults`): channel -> detail row of its 429 quota refusals.
        self.usage = {n: r.detail.add("rate_limited", QUOTA_HTTP, QUOTA_ERROR_TYPE) for n, r in self.runs.items()
                      if r.profile.quota_remaining is not None
                      or any(f.kind in ("stream_stall", "quota_drain", "cost_creep") for f in r.faults)}
        self.scheduled = self._scheduled_failures()
        self.prefix = event_id_prefix(scenario.name, self.seed, self.start_ms)

    # ------------------------------------------------------------------ helpers

    def _scheduled_failures(self) -> list[tuple[np.ndarray, _ChannelRun, Fault, int]]:
        out = []
        for run in self.runs.values():
            for f in run.faults:
                if f.kind == "consecutive_failures":
                    p = f.params
                    d = run.detail.add(p.get("status", "error"), p.get("http_status", 502), p.get("error_type", "upstream_error"),
                                       p.get("error_message"), p.get("retry_after_s"))
                    out.append((f.failure_times_s(), run, f, d))
        return out

    def _shares_vector(self, route: RouteSpec, b0: int) -> np.ndarray:
        names = route.channel_names
        if self.shares_fn is not None:
            got = self.shares_fn(route.name, self.start_ms + b0 * 1000)
            vec = np.array([float(got.get(n, 0.0)) for n in names], dtype=np.float64)
            if not np.all(np.isfinite(vec)) or np.any(vec < 0):
                raise ValueError(f"shares({route.name!r}) returned a negative or non-finite share: {dict(got)}")
            if vec.sum() > 0:
                return vec
        return np.array([route.shares[n] for n in names], dtype=np.float64)

    # ------------------------------------------------------------------ outcomes

    def _outcomes(self, run: _ChannelRun, t: np.ndarray, load_rps: float, block: _Block) -> tuple[np.ndarray, np.ndarray]:
        """Simulate requests of ``run`` arriving at ``t``; append dicts to ``block``.

        Returns ``(finish_s, failed)`` of these requests (shape (n,)).
        """
        n = len(t)
        p = run.profile
        rng = run.rng
        u, v, jitter, pick, s_struct, s_json, s_hollow, s_check, s_gw, s_ans = rng.random((10, n))
        status = np.zeros(n, dtype=np.int64)
        detail = np.zeros(n, dtype=np.int64)
        # Failure components: baseline, each error ramp, overload.
        if run.faults or run.profile.capacity_rps is not None:
            eff: Effects | None = channel_effects(p, run.faults, t)
            ol_lat, ol_err = overload_factors(eff, load_rps)
            neg = 0.0
            comps: list[tuple[np.ndarray | float, Mapping[str, float]]] = []
            for extra, mix in eff.error_extra:
                neg = neg + np.minimum(extra, 0.0)
                comps.append((np.maximum(extra, 0.0), mix))
            comps.insert(0, (np.maximum(p.base_error_rate + neg, 0.0), run.base_mix))
            if np.any(ol_err > 0):
                comps.append((ol_err, OVERLOAD_MIX))
            lat_mult = self.curve.latency_multiplier(t) * eff.latency_factor * ol_lat
        else:
            eff = None
            comps = [(p.base_error_rate, run.base_mix)]
            lat_mult = self.curve.latency_multiplier(t)
        lo: np.ndarray | float = 0.0
        for prob, mix in comps:
            hi = lo + prob
            hit = (u >= lo) & (u < hi) & (status == 0)
            if hit.any():
                st = _mix_pick(mix, v[hit])
                status[hit] = st
                detail[hit] = run.base_detail[st]
            lo = hi
        lat, ttft, gap = run.latency.sample(rng, n)
        lat = lat * lat_mult
        ttft = ttft * lat_mult
        gap = gap * lat_mult
        latency = lat
        if status.any():
            err = status == _STATUS_INDEX["error"]
            latency = np.where(err, lat * (ERROR_LATENCY_SHARE[0] + (ERROR_LATENCY_SHARE[1] - ERROR_LATENCY_SHARE[0]) * jitter), latency)
            latency = np.where(status == _STATUS_INDEX["timeout"], p.timeout_ms, latency)
            rl0, rl1 = RATE_LIMITED_LATENCY_MS
            latency = np.where(status == _STATUS_INDEX["rate_limited"], rl0 + (rl1 - rl0) * jitter, latency)
        if eff is not None and eff.outages:
            for k, f in enumerate(eff.outages):
                m = eff.outage == k
                if m.any():
                    status[m] = _STATUS_INDEX[f.params.get("status", "error")]
                    detail[m] = run.outage_detail[k]
                    latency = np.where(m, float(f.params.get("latency_ms", 60.0)) * (0.7 + 0.6 * jitter), latency)
        for f, d in run.caller_detail:  # SPEC §4.1: the client's fault; drawn only in scenarios that have one
            m = f.active(t) & (status == 0) & (rng.random(n) < float(f.params["share"]))
            if m.any():
                status[m], detail[m] = _STATUS_INDEX["error"], d
                latency = np.where(m, 40.0 * (0.7 + 0.6 * jitter), latency)
        marks = None
        if p.name in self.usage:
            rl = _STATUS_INDEX["rate_limited"]
            latency = np.array(latency, dtype=np.float64)
            refused, marks = apply_usage_faults(p, run.faults, t, status, latency, ttft, gap, rng,
                                                (rl, *RATE_LIMITED_LATENCY_MS))
            status[refused], detail[refused] = rl, self.usage[p.name]
        latency = np.round(latency, 1)
        ok = status == 0
        # Tokens from the route's Azure trace.
        tok = (pick * len(run.trace.context_tokens)).astype(np.int64)
        inp = run.trace.context_tokens[tok]
        out = np.where(ok, run.trace.generated_tokens[tok], 0)
        cost = (inp * p.price_in_usd_per_mtok + out * p.price_out_usd_per_mtok) / 1e6
        factor = cost_factor(p.name, run.faults, t) if marks is not None else None
        cost = np.round(cost if factor is None else cost * factor, 8)
        gw = (s_gw * len(GATEWAY_IDS)).astype(np.int64)
        # Structured answers.
        if p.structured_share > 0:
            structured = (s_struct < p.structured_share) & ok
            as_json = s_json < p.json_object_share
            missing = eff.missing_rate if eff is not None else p.missing_rate
            hollow = s_hollow < missing
            gw_check = s_check < p.gateway_check_share
        else:
            structured = as_json = hollow = gw_check = None
        finish_ms = np.floor(t * 1000.0 + latency).astype(np.int64)
        block.ts.append(finish_ms)
        chat = (eff.useless_rate, eff.useless_mix) if eff is not None else None
        k0 = len(block.events)
        self._emit(run, finish_ms, status, detail, latency, ttft, gap, inp, out, cost, gw,
                   structured, as_json, hollow, gw_check, s_ans, block, chat)
        if marks is not None:
            marks.annotate(block.events[k0:])
        return finish_ms / 1000.0, ~ok

    def _emit(self, run, finish_ms, status, detail, latency, ttft, gap, inp, out, cost, gw,
              structured, as_json, hollow, gw_check, pick, block: _Block, chat=None) -> None:
        p = run.profile
        name, route, tier = p.name, p.route, p.tier
        rows = run.detail.rows
        start = self.start_ms
        ts_l = (finish_ms + start).tolist()
        det_l = detail.tolist()
        lat_l = latency.tolist()
        ttft_l = np.round(ttft, 1).tolist()
        gap_l = np.round(gap, 1).tolist()
        in_l = inp.tolist()
        out_l = out.tolist()
        cost_l = cost.tolist()
        gw_l = gw.tolist()
        evs = []
        for i in range(len(ts_l)):
            st, http, et, msg, retry = rows[det_l[i]]
            e = {
                "event_id": "",
                "ts_ms": ts_l[i],
                "channel": name,
                "route": route,
                "status": STATUS_NAMES[st],
                "latency_ms": lat_l[i],
                "gateway_id": GATEWAY_IDS[gw_l[i]],
                "tier": tier,
                "input_tokens": in_l[i],
                "output_tokens": out_l[i],
            }
            if http is not None:
                e["http_status"] = http
            if st == 0:
                e["ttft_ms"] = ttft_l[i]
                e["max_stream_gap_ms"] = gap_l[i]
                e["cost_usd"] = cost_l[i]
            else:
                e["error_type"] = et
                if msg is not None:
                    e["error_message"] = msg
                if retry is not None:
                    e["retry_after_s"] = retry
            if p.account is not None:
                e["account"] = p.account
            evs.append(e)
        if run.text_rng is not None and self.chat_pool:
            self._attach_chat(run, evs, status, structured, chat)
        if structured is None or self.bank is None:
            block.events.extend(evs)
            return
        idx = np.flatnonzero(structured)
        if len(idx):
            bank = self.bank
            for i in idx.tolist():
                pool = bank.json_objects if as_json[i] else bank.tool_calls
                ans = pool[int(pick[i] * len(pool))]
                e = evs[i]
                e["expected_fields"] = ans.expected_fields
                e["prompt_text"] = ans.prompt
                if gw_check[i]:
                    e["missing_fields"] = list(ans.missing) if hollow[i] else []
                else:
                    e["response_text"] = ans.hollow_text if hollow[i] else ans.text
        block.events.extend(evs)

    def _attach_chat(self, run: _ChannelRun, evs: list[dict], status: np.ndarray,
                     structured: np.ndarray | None, chat) -> None:
        """Give ``chat_share`` of the ok, unstructured events a pool answer (maybe a useless one)."""
        n = len(evs)
        pool = self.chat_pool
        assert pool and run.text_rng is not None
        r_chat, r_pick, r_bad, r_kind = run.text_rng.random((4, n))
        sel = (np.asarray(status) == 0) & (r_chat < run.profile.chat_share)
        if structured is not None:
            sel &= ~structured
        if chat is not None:
            useless, mix = chat
            kinds = list(mix)
            cum = np.cumsum([mix[k] for k in kinds])
        else:
            useless, kinds, cum = None, [], None
        for i in np.flatnonzero(sel).tolist():
            ans = pool[int(r_pick[i] * len(pool))]
            e = evs[i]
            e["prompt_text"] = ans.prompt
            if useless is not None and r_bad[i] < useless[i]:
                k = kinds[min(int(np.searchsorted(cum, r_kind[i] * cum[-1], side="right")), len(kinds) - 1)]
                e["response_text"] = ans.useless[k]
            else:
                e["response_text"] = ans.text

    def _scheduled_block(self, b0: int, b1: int, block: _Block) -> None:
        for times, run, f, det in self.scheduled:
            sel = times[(times >= b0) & (times < b1)]
            if not len(sel):
                continue
            n = len(sel)
            lat = np.round(float(f.params.get("latency_ms", 250.0)) * run.rng.uniform(0.8, 1.2, n), 1)
            finish_ms = np.floor(sel * 1000.0 + lat).astype(np.int64)
            block.ts.append(finish_ms)
            st_idx = run.detail.rows[det][0]
            tok = run.rng.integers(len(run.trace.context_tokens), size=n)
            zeros = np.zeros(n)
            self._emit(run, finish_ms, np.full(n, st_idx), np.full(n, det), lat, zeros, zeros,
                       run.trace.context_tokens[tok], np.zeros(n, dtype=np.int64), zeros,
                       run.rng.integers(len(GATEWAY_IDS), size=n), None, None, None, None, None, block)

    def _replay_block(self, b0: int, b1: int, block: _Block) -> None:
        for rc in self.replays:
            tr = rc.trace(self.data_dir)
            arr = rc.arrivals_s(len(tr))
            lo, hi = np.searchsorted(arr, [b0, b1], side="left")
            if hi <= lo:
                continue
            finish_ms = np.floor(arr[lo:hi] * 1000.0 + tr.e2e_latency_s[lo:hi] * 1000.0).astype(np.int64)
            block.ts.append(finish_ms)
            for j, i in enumerate(range(lo, hi)):
                st = tr.status[i]
                e = {
                    "event_id": "",
                    "ts_ms": int(finish_ms[j]) + self.start_ms,
                    "channel": rc.name,
                    "route": rc.route,
                    "status": st,
                    "latency_ms": round(float(tr.e2e_latency_s[i]) * 1000.0, 1),
                    "gateway_id": GATEWAY_IDS[0],
                    "tier": rc.tier,
                    "input_tokens": int(tr.input_tokens[i]),
                    "output_tokens": int(tr.output_tokens[i]),
                }
                http = REPLAY_HTTP[st]
                if http is not None:
                    e["http_status"] = http
                if tr.ttft_s[i] > 0:
                    e["ttft_ms"] = round(float(tr.ttft_s[i]) * 1000.0, 1)
                if st != "ok":
                    e["error_type"] = f"llmperf_error_{tr.error_code[i]}"
                block.events.append(e)

    # ------------------------------------------------------------------ main loop

    def _route_block(self, route: RouteSpec, b0: int, b1: int, block: _Block) -> None:
        rng = self.route_rng[route.name]
        secs = np.arange(b0, b1)
        lam = route.peak_rps * self.curve.load_factor(secs + 0.5) * self.bursts[route.name].factor(secs)
        counts = rng.poisson(lam)
        n = int(counts.sum())
        arr = np.repeat(secs, counts) + rng.random(n)
        names = route.channel_names
        runs = [self.runs[c] for c in names]
        shares = self._shares_vector(route, b0)
        cum = np.cumsum(shares)
        ch = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"), len(names) - 1)
        # Reassign requests that land on a suppressed channel.
        for k, run in enumerate(runs):
            if not any(f.kind == "consecutive_failures" for f in run.faults):
                continue
            mine = np.flatnonzero(ch == k)
            if not len(mine):
                continue
            sup = channel_effects(run.profile, run.faults, arr[mine]).suppressed
            moved = mine[sup]
            if not len(moved):
                continue
            others = shares.copy()
            others[k] = 0.0
            if others.sum() <= 0:
                ch[moved] = -1  # nowhere to go: dropped
            else:
                oc = np.cumsum(others)
                ch[moved] = np.minimum(np.searchsorted(oc, rng.random(len(moved)) * oc[-1], side="right"), len(names) - 1)
        length = float(b1 - b0)
        decay = math.exp(-length / LOAD_TAU_S)
        groups = [np.sort(arr[ch == k]) for k in range(len(names))]
        for run, t in zip(runs, groups):
            rate = (len(t) + run.pending_retries) / length
            run.load_rps = rate if run.load_rps is None else decay * run.load_rps + (1 - decay) * rate
            run.pending_retries = 0
        failed_at: list[tuple[int, np.ndarray]] = []
        for k, (run, t) in enumerate(zip(runs, groups)):
            if not len(t):
                continue
            finish_s, failed = self._outcomes(run, t, run.load_rps or 0.0, block)
            if route.retry_failures and failed.any():
                failed_at.append((k, finish_s[failed] + RETRY_DELAY_S))
        for k, t_retry in failed_at:
            others = shares.copy()
            others[k] = 0.0
            if others.sum() <= 0:
                continue
            oc = np.cumsum(others)
            tgt = np.minimum(np.searchsorted(oc, rng.random(len(t_retry)) * oc[-1], side="right"), len(names) - 1)
            for j, run in enumerate(runs):
                tj = np.sort(t_retry[tgt == j])
                if len(tj):
                    run.pending_retries += len(tj)
                    self._outcomes(run, tj, run.load_rps or 0.0, block)

    def events(self) -> Iterator[dict]:
        """Yield JSON-ready RequestEvent dicts in non-decreasing ``ts_ms``."""
        duration = int(math.ceil(self.sc.duration_s))
        pending: list[dict] = []
        counter = 0
        prefix = self.prefix
        key = itemgetter("ts_ms")
        for b0 in range(0, duration, self.block_s):
            b1 = min(b0 + self.block_s, duration)
            block = _Block()
            for route in self.sc.routes:
                self._route_block(route, b0, b1, block)
            self._scheduled_block(b0, b1, block)
            self._replay_block(b0, b1, block)
            if block.events:
                ts = np.concatenate(block.ts) if block.ts else np.zeros(0, dtype=np.int64)
                order = np.argsort(ts, kind="stable")
                evs = block.events
                new = [evs[i] for i in order.tolist()]
                merged = list(heapq.merge(pending, new, key=key)) if pending else new
            else:
                merged = pending
            cut_ms = self.start_ms + b1 * 1000
            cut = bisect_left([e["ts_ms"] for e in merged], cut_ms) if b1 < duration else len(merged)
            for e in merged[:cut]:
                e["event_id"] = f"{prefix}-{counter:08d}"
                counter += 1
                yield e
            pending = merged[cut:]
        for e in pending:
            e["event_id"] = f"{prefix}-{counter:08d}"
            counter += 1
            yield e
