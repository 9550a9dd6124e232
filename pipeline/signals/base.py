"""The signal plug-in contract: what one SPEC §4 signal module declares.

A signal is one module holding a detector (stateless ``detect(view, th,
active) -> Finding``, :mod:`pipeline.signals.base`) and a :class:`Signal`
record: its typed parameters, the window features it reads, its reason
codes and metric names, the counters it adds to the windows, its README
line and example inputs for the shared battery
(``tests/unit/test_detectors_contract.py``). :mod:`pipeline.signals.registry`
lists the signals; the engine, the policy loader (``[tier.X.<name>]``
tables), snapshots and the README's policy table follow from that list.
The recipe: ``docs/ADDING_A_SIGNAL.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Protocol, Sequence

import numpy as np

from pipeline.windows.extension import SignalWindows, WindowSpec
from pipeline.windows.features import Counter
from pipeline.windows.view import WindowView


@dataclass(frozen=True)
class Finding:
    """A detector's result for all channels.

    ``reason``: the verdict reason code (SPEC §3); ``fired`` bool (C,);
    ``metrics``: name → float64 (C,) numbers behind the reason (NaN where
    not computable).
    """

    reason: str
    fired: np.ndarray
    metrics: dict[str, np.ndarray]


@dataclass(frozen=True)
class ThresholdArrays:
    """:class:`~pipeline.policy.defaults.Thresholds` fields as per-channel float64 arrays (C,)."""

    values: dict[str, np.ndarray]

    @classmethod
    def build(cls, per_channel: Sequence[Any], names: Sequence[str]) -> "ThresholdArrays":
        """Stack one thresholds object per channel (C of them) into float64 arrays (C,), one per field
        in ``names`` (callers use :func:`pipeline.policy.defaults.threshold_arrays`, which names every
        :class:`~pipeline.policy.defaults.Thresholds` field; the policy is built from the signal
        registry, so this contract does not import it).

        Channels mostly share their tier's object: each field is read once per distinct object and
        spread by index, not read per channel.
        """
        slot: dict[int, int] = {}
        distinct: list[Any] = []
        for t in per_channel:
            if id(t) not in slot:
                slot[id(t)] = len(distinct)
                distinct.append(t)
        where = np.fromiter(map(slot.__getitem__, map(id, per_channel)), np.intp, len(per_channel))
        return cls({n: np.array([getattr(t, n) for t in distinct], dtype=np.float64)[where] for n in names})

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


class Detector(Protocol):
    """What every detector implements (see ``tests/unit/test_detectors_contract.py``)."""

    reason: str

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Evaluate all channels; arrays in ``view``/``th``/``active`` have shape (C,)."""
        ...


@dataclass(frozen=True)
class Bound:
    """The values one parameter may take: ``gt``/``ge`` and ``lt``/``le`` (numbers, open or closed ends),
    ``one_of`` (a tuple of allowed values) or ``boolean``; ``says``: how the error message states the
    range (default: from the ends, e.g. ``in (0, 1)``, ``>= 1``). NaN is never in range."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    one_of: tuple[Any, ...] | None = None
    boolean: bool = False
    says: str | None = None

    def holds(self, v: Any) -> bool:
        """Whether ``v`` is in range."""
        if self.boolean:
            return isinstance(v, (bool, np.bool_))
        if self.one_of is not None:
            return v in self.one_of
        return ((self.gt is None or v > self.gt) and (self.ge is None or v >= self.ge)
                and (self.lt is None or v < self.lt) and (self.le is None or v <= self.le))

    def describe(self) -> str:
        """The range in words, as the error message states it."""
        if self.says is not None:
            return self.says
        if self.boolean:
            return "true or false"
        if self.one_of is not None:
            return f"one of {self.one_of}"
        lo = (f"({self.gt:g}" if self.gt is not None else f"[{self.ge:g}" if self.ge is not None else None)
        hi = (f"{self.lt:g})" if self.lt is not None else f"{self.le:g}]" if self.le is not None else None)
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'>' if self.gt is not None else '>='} {lo[1:]}"
        return f"{'<' if self.lt is not None else '<='} {hi[:-1]}"  # type: ignore[index]


def param(default: Any, **bound: Any) -> Any:
    """A :class:`Params` field: its ``default`` and its :class:`Bound` (keyword arguments), e.g.
    ``error_rate_trip: float = param(0.005, gt=0, lt=1)``."""
    return field(default=default, metadata={"bound": Bound(**bound)})


@dataclass(frozen=True)
class Order:
    """A rule between two parameters: ``floor <= low < high`` (and ``high <= ceiling`` when given)."""

    low: str
    high: str
    floor: float
    ceiling: float | None = None


@dataclass(frozen=True)
class Params:
    """The validated parameter base every signal's ``params`` class derives from (a frozen dataclass).

    Each field declares its range with :func:`param`; :attr:`ORDER` holds the rules between fields.
    Construction raises ``ValueError`` naming the key and the range: ``"<key> must be in (0, 1), got
    1.5"`` or ``"need 1 <= <low> < <high>, got 1.9 and 1.8"``; the rules between fields are checked
    first, then the fields in declaration order. The policy loader builds these classes from
    ``[tier.X.<signal>]`` tables, so a bad policy file names the key it got wrong.
    """

    #: Rules between two fields (checked before the per-field ranges).
    ORDER: ClassVar[tuple[Order, ...]] = ()

    def __post_init__(self) -> None:
        for o in self.ORDER:
            low, high = getattr(self, o.low), getattr(self, o.high)
            top = o.ceiling is None or high <= o.ceiling
            if not (o.floor <= low < high and top):
                ceiling = "" if o.ceiling is None else f" <= {o.ceiling:g}"
                raise ValueError(f"need {o.floor:g} <= {o.low} < {o.high}{ceiling}, got {low} and {high}")
        for f in dataclasses.fields(self):
            bound = f.metadata.get("bound")
            value = getattr(self, f.name)
            if bound is not None and not bound.holds(value):
                got = repr(value) if bound.boolean else value
                raise ValueError(f"{f.name} must be {bound.describe()}, got {got}")


@dataclass(frozen=True)
class Examples:
    """Example inputs for the shared battery: WindowView fields → value (scalars broadcast).

    ``firing``: evidence on which the detector fires (given on top of a busy,
    clean view); ``thin``: cases below a minimum sample that must not fire
    although the values would; ``all_failures_fires``: whether a view in
    which every request failed fires this signal.
    """

    firing: Mapping[str, float]
    thin: tuple[Mapping[str, float], ...]
    all_failures_fires: bool = False


@dataclass(frozen=True)
class Signal:
    """One signal's declaration (see the module docstring).

    ``name``: reason code (SPEC §3), policy table name and metric prefix
    where one fits; ``kind``: ``"hard"`` (opens the circuit), ``"soft"``
    (degrades) or ``"advisory"`` (its reason is published while the finding
    holds, in any state but ``no_data``, without changing state or weight;
    ``degrades`` optionally names a bool parameter that, true for a channel,
    makes the finding degrade it like a soft one, SPEC §4.8); ``params``: a frozen dataclass, normally a :class:`Params` subclass, whose fields (with defaults and
    ranges declared by :func:`param`, validation naming the key) are the thresholds the
    detector reads from ``th``; field names must be unique over all signals;
    ``tier_defaults``: tier → field overrides of the built-in defaults (e.g.
    the free tier's lower error line); ``features``: the WindowView fields
    (or ``Counter`` sums) ``detect`` reads; ``metrics``: the keys of its
    ``Finding.metrics``; ``counters``: window counters it adds to the store
    (empty in a restored snapshot that predates them); ``windows``: optional
    factory of the signal's own windows (:mod:`pipeline.windows.extension`,
    for features that are not counter sums; ``name`` = the signal's name,
    empty in a restored snapshot that predates them); ``detector``: the
    object with ``detect``; ``rule`` / ``default``: its README policy line.
    """

    name: str
    kind: Literal["hard", "soft", "advisory"]
    params: type
    features: tuple[str, ...]
    metrics: tuple[str, ...]
    detector: Any
    examples: Examples
    rule: str
    default: str
    tier_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    counters: tuple[Counter, ...] = ()
    windows: Callable[[WindowSpec], SignalWindows] | None = None
    degrades: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("hard", "soft", "advisory"):
            raise ValueError(f"signal {self.name}: kind must be 'hard', 'soft' or 'advisory', got {self.kind!r}")
        dc_params = getattr(self.params, "__dataclass_params__", None)  # set on every dataclass type
        if not dataclasses.is_dataclass(self.params) or dc_params is None or not dc_params.frozen:
            raise TypeError(f"signal {self.name}: params must be a frozen dataclass")
        if getattr(self.detector, "reason", None) != self.name:
            raise ValueError(f"signal {self.name}: detector.reason is {getattr(self.detector, 'reason', None)!r}")
        known = self.param_names()
        if self.degrades is not None and (self.kind != "advisory" or self.degrades not in known):
            raise ValueError(f"signal {self.name}: degrades={self.degrades!r} needs kind 'advisory' and one of "
                             f"its parameters {list(known)}")
        for tier, table in self.tier_defaults.items():
            bad = set(table) - set(known)
            if bad:
                raise ValueError(f"signal {self.name}: tier_defaults[{tier!r}] has unknown keys {sorted(bad)}")

    @property
    def reasons(self) -> tuple[str, ...]:
        """Reason codes this signal publishes (its name)."""
        return (self.name,)

    def param_names(self) -> tuple[str, ...]:
        """Field names of :attr:`params`, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self.params))


def check_registry(signals: tuple[Signal, ...]) -> None:
    """Raise ``ValueError`` when names, parameter fields, counters or metric names collide."""
    seen: dict[str, str] = {}
    for s in signals:
        for what, names in (("signal", (s.name,)), ("parameter", s.param_names()),
                            ("counter", tuple(c.name for c in s.counters)), ("metric", s.metrics)):
            for n in names:
                key = f"{what}:{n}"
                if key in seen:
                    raise ValueError(f"{what} {n!r} is declared by both {seen[key]} and {s.name}")
                seen[key] = s.name
