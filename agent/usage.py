"""Simulated GPU memory demand: the ``sim.headroom.dev/usage`` pod annotation.

Only the simulated backend reads it. Its JSON picks one of the three seed 001
workloads; quantities are Kubernetes quantities (``"8Gi"``) or plain bytes::

    {"pattern": "steady", "base": "8Gi", "amplitude": "2Gi", "periodSeconds": 120}
    {"pattern": "spiky", "base": "2Gi", "amplitude": "8Gi", "periodSeconds": 60,
     "spikeSeconds": 15}
    {"pattern": "leak", "base": "1Gi", "ratePerMinute": "6Gi", "max": "40Gi"}

``t`` below is seconds since the pod started (``status.startTime``), so every
agent, and a restarted one, computes the same curve.

- steady: ``base + amplitude * (1 - cos(2πt/period)) / 2`` -- starts at base,
  peaks at base + amplitude halfway through each period;
- spiky: ``base``, plus ``amplitude`` during the last ``spikeSeconds`` of each
  period (default a quarter of it);
- leak: ``base + ratePerMinute * t / 60``, capped at ``max`` when given.
"""

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from headroom.names import ANNOTATION_SIMULATED_USAGE
from headroom.quantity import QuantityError, parse_bytes

MAX_ANNOTATION_BYTES = 4096


def _bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("expected a quantity such as 8Gi")
    try:
        return parse_bytes(value)
    except QuantityError as err:
        raise ValueError(str(err)) from err


Bytes = Annotated[int, BeforeValidator(_bytes)]


class _Pattern(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Steady(_Pattern):
    pattern: Literal["steady"]
    base: Bytes
    amplitude: Bytes = 0
    period_seconds: float = Field(default=60.0, gt=0, le=86400)

    def demand(self, t: float) -> int:
        wave = (1 - math.cos(2 * math.pi * t / self.period_seconds)) / 2
        return self.base + round(self.amplitude * wave)


class Spiky(_Pattern):
    pattern: Literal["spiky"]
    base: Bytes
    amplitude: Bytes
    period_seconds: float = Field(default=60.0, gt=0, le=86400)
    spike_seconds: float | None = Field(default=None, gt=0)

    def demand(self, t: float) -> int:
        spike = self.spike_seconds or self.period_seconds / 4
        in_spike = t % self.period_seconds >= self.period_seconds - min(spike, self.period_seconds)
        return self.base + (self.amplitude if in_spike else 0)


class Leak(_Pattern):
    pattern: Literal["leak"]
    base: Bytes
    rate_per_minute: Bytes
    max: Bytes | None = None

    def demand(self, t: float) -> int:
        grown = self.base + round(self.rate_per_minute * max(t, 0.0) / 60)
        return grown if self.max is None else min(grown, self.max)


UsagePattern = Annotated[Steady | Spiky | Leak, Field(discriminator="pattern")]
_ADAPTER: TypeAdapter[Steady | Spiky | Leak] = TypeAdapter(UsagePattern)


class UsageError(ValueError):
    """The annotation is not a usage pattern; the message names the annotation and field."""


def parse_usage(text: str) -> Steady | Spiky | Leak:
    """The pattern in an annotation value."""
    where = f"annotation {ANNOTATION_SIMULATED_USAGE}"
    if len(text) > MAX_ANNOTATION_BYTES:
        raise UsageError(f"{where}: longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not JSON: {err}") from err
    try:
        return _ADAPTER.validate_python(document)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or '(value)'}: {problem['msg']}"
            for problem in err.errors(include_url=False)[:3]
        )
        raise UsageError(f"{where}: {problems}") from err
