"""``channel-health override``: operators' manual switches (SPEC §4, §7; issue #20).

Registered in :mod:`pipeline.cli.main`. Records are signed with a key of
``CHANNEL_HEALTH_CONTROL_KEYS`` (``--key-id`` when several are configured;
:mod:`pipeline.stream.control`); without keys they are sent unsigned and the
command says so once on stderr. ``list`` and ``clear`` read the topic verified
and bounded exactly as the worker does.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import time
from typing import Optional

import typer

from pipeline.cli.settings import kafka_settings_or_exit
from pipeline.config import ConfigError, Settings, parse_duration_ms
from pipeline.redaction import redact_secrets

override_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode="markdown",
    help="Manual switches, the last resort: force a channel open, healthy or to a weight, or freeze a route's "
         "weights, with a reason and an expiry. Stored on the compacted topic channel.control; the worker applies "
         "them within a second (verdicts show `override` while the detectors keep running), audits every change "
         "and expiry in ClickHouse (channel_overrides).\n\n"
         "Example: `channel-health override set openai-east --open --ttl 30m --reason 'vendor incident #123'`")

#: How long the CLI reads channel.health / channel.control to their end (s).
READ_TIMEOUT_S = 15.0


def _fail(message: str, code: int = 2) -> None:
    typer.secho(redact_secrets(message), fg="red", err=True)
    raise typer.Exit(code)


_settings = kafka_settings_or_exit


#: A TTL names its unit: ``5m``, ``1h``, ``90s`` (a bare ``5`` is refused: 5 seconds or 5 minutes? issue #35).
TTL_FORM = re.compile(r"\s*[0-9]+(?:\.[0-9]*)?\s*(ms|s|m|h|d|w)\s*", re.IGNORECASE)


def _ttl_ms(ttl: Optional[str]) -> int:
    """Milliseconds of ``--ttl`` (a number with a unit: ms, s, m, h, d, w); exits 2 with a clear line otherwise."""
    if not ttl:
        _fail("--ttl is required (e.g. --ttl 30m): every override expires.")
    if not TTL_FORM.fullmatch(ttl):
        _fail(f"--ttl {ttl!r} needs a unit: e.g. 90s, 5m, 1h, 1d (a bare number is refused, it is ambiguous)")
    try:
        return parse_duration_ms(ttl, "--ttl")
    except ConfigError as exc:
        _fail(str(exc))
    raise AssertionError  # unreachable


def _reason(reason: Optional[str]) -> str:
    if not reason or not reason.strip():
        _fail("--reason is required: say why (it is shown in every verdict and audited).")
    return reason.strip()


def known_routes(settings: Settings, timeout_s: float = READ_TIMEOUT_S) -> dict[str, str]:
    """Channel -> route of every channel with a verdict on ``channel.health`` (read to its end)."""
    from pipeline.contracts import decode_verdict
    from pipeline.stream.control import read_to_end

    out: dict[str, str] = {}

    def handle(key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return
        try:
            v = decode_verdict(value)
        except ValueError:  # msgspec errors subclass ValueError; a bad record names no channel
            return
        out[v.channel] = v.route

    asyncio.run(read_to_end(settings.kafka_bootstrap or "", settings.topics.health, handle,
                            settings.kafka_security.aiokafka_kwargs(), timeout_s))
    return out


def _check_ttl(settings: Settings, ttl_ms: int) -> None:
    most = settings.control.max_ttl_ms
    if ttl_ms > most:
        _fail(f"--ttl {ttl_ms / 3_600_000:g} h exceeds the maximum override TTL {most / 3_600_000:g} h "
              f"(CHANNEL_HEALTH_OVERRIDE_MAX_TTL): the worker would refuse it")


def _send(settings: Settings, record: object, key_id: Optional[str] = None) -> None:
    from aiokafka import AIOKafkaProducer

    from pipeline.stream.control import encode_record

    if not settings.control.keys:
        typer.secho("warning: CHANNEL_HEALTH_CONTROL_KEYS is unset: the record is sent unsigned (a worker with keys "
                    "refuses it)", fg="yellow", err=True)
    try:
        key, value = encode_record(record, settings.control, key_id)  # type: ignore[arg-type]
    except ValueError as exc:
        _fail(str(exc))

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all",
                                    **settings.kafka_security.aiokafka_kwargs())
        await producer.start()
        try:
            await producer.send_and_wait(settings.topics.control, value, key=key)
        finally:
            await producer.stop()

    asyncio.run(send())


@override_app.command("set")
def override_set(
    channel: str = typer.Argument(..., help="The channel, as named in its verdicts."),
    open_: bool = typer.Option(False, "--open", help="Force the channel open: no traffic."),
    healthy: bool = typer.Option(False, "--healthy", help="Force the channel healthy: weight 1."),
    weight: Optional[float] = typer.Option(None, "--weight", help="Force the channel's weight (0..1)."),
    ttl: Optional[str] = typer.Option(None, "--ttl", help="Expiry, e.g. 30m, 2h (required)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (required; shown in verdicts, audited)."),
    by: Optional[str] = typer.Option(None, "--by", help="Who sets it (default: the login name)."),
    any_channel: bool = typer.Option(False, "--any-channel",
                                     help="Allow a channel that has no verdict on channel.health yet."),
    key_id: Optional[str] = typer.Option(None, "--key-id", help="Key of CHANNEL_HEALTH_CONTROL_KEYS that signs the "
                                         "record (default: the only one configured)."),
) -> None:
    """Force one channel open, healthy or to a weight until the TTL passes.

    Exactly one of --open, --healthy, --weight W. The detectors keep running: the verdict keeps their
    reasons and shows the engine's own state in metrics.engine_state.

    Example: `channel-health override set openai-east --weight 0.2 --ttl 2h --reason "rate limits, ticket 4711"`
    """
    from pipeline.policy.override import Override
    from pipeline.stream.control import SetRecord

    chosen = [name for name, on in (("--open", open_), ("--healthy", healthy), ("--weight", weight is not None)) if on]
    if len(chosen) != 1:
        _fail("give exactly one of --open, --healthy, --weight W" + (f" (got {', '.join(chosen)})" if chosen else ""))
    if weight is not None and not (0.0 <= weight <= 1.0):
        _fail(f"--weight must be in 0..1, got {weight}")
    ttl_ms, text = _ttl_ms(ttl), _reason(reason)
    settings = _settings()
    _check_ttl(settings, ttl_ms)
    if not any_channel:
        routes = known_routes(settings)
        if channel not in routes:
            _fail(f"unknown channel {channel!r}: no verdict for it on {settings.topics.health} "
                  f"({len(routes)} channels known; --any-channel to set it anyway)")
    now = int(time.time() * 1000)
    kind = "open" if open_ else "healthy" if healthy else "weight"
    o = Override(kind=kind, by=by or getpass.getuser(), reason=text, set_ts_ms=now, expires_ts_ms=now + ttl_ms,
                 channel=channel, weight=weight)
    _send(settings, SetRecord(o), key_id)
    typer.echo(f"override set: {channel} {kind}{'' if weight is None else f' {weight}'} until "
               f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(o.expires_ts_ms / 1000))} ({text})")


@override_app.command("freeze")
def override_freeze(
    route: str = typer.Option(..., "--route", help="The route whose weights to hold."),
    ttl: Optional[str] = typer.Option(None, "--ttl", help="Expiry, e.g. 15m (required)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (required; shown in verdicts, audited)."),
    by: Optional[str] = typer.Option(None, "--by", help="Who sets it (default: the login name)."),
    key_id: Optional[str] = typer.Option(None, "--key-id", help="Key of CHANNEL_HEALTH_CONTROL_KEYS that signs the "
                                         "record (default: the only one configured)."),
) -> None:
    """Hold every channel of a route at its current weight and share (the global switch).

    Verdicts still report the detectors' state and reasons; only weight and route_share are held.

    Example: `channel-health override freeze --route gpt-4o --ttl 15m --reason "deploy window"`
    """
    from pipeline.policy.override import Override
    from pipeline.stream.control import SetRecord

    ttl_ms, text = _ttl_ms(ttl), _reason(reason)
    settings = _settings()
    _check_ttl(settings, ttl_ms)
    if route not in set(known_routes(settings).values()):
        _fail(f"unknown route {route!r}: no verdict for it on {settings.topics.health}")
    now = int(time.time() * 1000)
    _send(settings, SetRecord(Override(kind="freeze", by=by or getpass.getuser(), reason=text, set_ts_ms=now,
                                       expires_ts_ms=now + ttl_ms, route=route)), key_id)
    typer.echo(f"route {route} frozen for {ttl} ({text})")


@override_app.command("list")
def override_list(as_json: bool = typer.Option(False, "--json", help="One JSON array on stdout.")) -> None:
    """List the overrides in force (read from channel.control).

    Example: `channel-health override list --json`
    """
    from pipeline.stream.control import read_overrides

    settings = _settings()
    table = asyncio.run(read_overrides(settings.kafka_bootstrap or "", settings.topics.control,
                                       settings.kafka_security.aiokafka_kwargs(), READ_TIMEOUT_S,
                                       control=settings.control))
    rows = [{"key": o.key, "kind": o.kind, "channel": o.channel, "route": o.route, "weight": o.weight, "by": o.by,
             "key_id": o.key_id, "reason": o.reason, "set_ts_ms": o.set_ts_ms, "expires_ts_ms": o.expires_ts_ms}
            for o in table.active()]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo("no override in force")
    now = time.time() * 1000
    for r in rows:
        typer.echo(override_line(r, now))


def override_line(r: dict, now_ms: float) -> str:
    """One ``override list`` line of ``r`` (a row of :func:`override_list`): key, kind, weight, seconds left
    until ``expires_ts_ms`` from ``now_ms`` (epoch ms), who, the signing key id and why. Names and texts pass
    :func:`~pipeline.escape.terminal_text`: one line, no terminal escape (SPEC §8)."""
    from pipeline.escape import terminal_text as t

    left_s = max(0, int((r["expires_ts_ms"] - now_ms) / 1000))
    return (f"{t(r['key']):<32} {t(r['kind']):<8} {'' if r['weight'] is None else r['weight']:<5} "
            f"{left_s:>6} s left  by {t(r['by'])} (key {t(r['key_id'] or 'unsigned')}): {t(r['reason'])}")


@override_app.command("clear")
def override_clear(
    channel: Optional[str] = typer.Argument(None, help="The channel whose override ends now."),
    route: Optional[str] = typer.Option(None, "--route", help="End a route's freeze instead."),
    reason: str = typer.Option("cleared by operator", "--reason", help="Why (audited)."),
    by: Optional[str] = typer.Option(None, "--by", help="Who clears it (default: the login name)."),
    key_id: Optional[str] = typer.Option(None, "--key-id", help="Key of CHANNEL_HEALTH_CONTROL_KEYS that signs the "
                                         "record (default: the only one configured)."),
) -> None:
    """End an override before its TTL (exit 1 when none is in force).

    Example: `channel-health override clear openai-east`  or  `channel-health override clear --route gpt-4o`
    """
    from pipeline.stream.control import ClearRecord, read_overrides

    if (channel is None) == (route is None):
        _fail("give a CHANNEL or --route R (one of them)")
    key = f"channel:{channel}" if channel is not None else f"route:{route}"
    settings = _settings()
    table = asyncio.run(read_overrides(settings.kafka_bootstrap or "", settings.topics.control,
                                       settings.kafka_security.aiokafka_kwargs(), READ_TIMEOUT_S,
                                       control=settings.control))
    if key not in {o.key for o in table.active()}:
        _fail(f"no override in force for {key}", code=1)
    _send(settings, ClearRecord(key=key, by=by or getpass.getuser(), reason=reason, at_ms=int(time.time() * 1000)),
          key_id)
    typer.echo(f"override cleared: {key}")
