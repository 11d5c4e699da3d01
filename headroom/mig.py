"""MIG profiles: the built-in catalogue, what the cluster offers, and the choice.

The catalogue is DESIGN.md §7 (memory in MiB as NVML reports it). Whatever the
nodes advertise -- ``nvidia.com/mig-<profile>`` capacity and the GPU Feature
Discovery label ``nvidia.com/mig-<profile>.memory`` -- wins over the table.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from headroom.names import MIG_PREFIX, is_time_sliced, mig_resource
from headroom.quantity import MIB, format_bytes

_NAME = re.compile(r"^(?P<slices>[1-9][0-9]*)g\.(?P<gb>[1-9][0-9]*)gb(?P<variant>[+-][a-z.]+)?$")
_LABEL = re.compile(r"^nvidia\.com/mig-(?P<resource>.+)\.(?P<attr>count|memory)$")
_UNKNOWN_MIB_PER_GB = 900
"""A profile neither the table nor any node describes gets ``900 MiB`` per
nominal GB: below every real ratio (4864 MiB for "5gb" is 973 per GB), so a pod
is never placed on a slice smaller than it declared."""


@dataclass(frozen=True)
class MigProfile:
    name: str
    """NVIDIA's spelling: ``3g.20gb``, ``1g.10gb+me``."""
    memory_mib: int
    max_instances: int = 1

    @property
    def resource(self) -> str:
        return mig_resource(self.name)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def slices(self) -> int:
        return parse_profile_name(self.name)[0]


def parse_profile_name(name: str) -> tuple[int, int, str]:
    """``1g.10gb+me`` -> ``(1, 10, "+me")``: compute slices, nominal GB, variant."""
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a MIG profile name (expected e.g. 3g.20gb)")
    return int(match["slices"]), int(match["gb"]), match["variant"] or ""


def profile_from_resource(resource: str) -> str | None:
    """``nvidia.com/mig-1g.10gb.me`` -> ``1g.10gb+me``; None for other resources."""
    if not resource.startswith(MIG_PREFIX):
        return None
    rest = resource[len(MIG_PREFIX) :]
    match = re.match(r"^([1-9][0-9]*g\.[1-9][0-9]*gb)(\.[a-z.]+|-[a-z.]+)?$", rest)
    if match is None:
        return None
    variant = match[2] or ""
    # The device plugin turns "+" into "." because "+" is not allowed in a resource name.
    return match[1] + ("+" + variant[1:] if variant.startswith(".") else variant)


def _table(*rows: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, mib, count) for name, mib, count in rows)


_A100_80GB = _table(
    ("1g.10gb", 9856, 7),
    ("1g.20gb", 19968, 4),
    ("2g.20gb", 19968, 3),
    ("3g.40gb", 40192, 2),
    ("4g.40gb", 40192, 1),
    ("7g.80gb", 80384, 1),
)
CATALOGUE: Mapping[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _table(
        ("1g.5gb", 4864, 7),
        ("1g.10gb", 9856, 4),
        ("2g.10gb", 9856, 3),
        ("3g.20gb", 19968, 2),
        ("4g.20gb", 19968, 1),
        ("7g.40gb", 40192, 1),
    ),
    "A100-80GB": _A100_80GB,
    "H100-80GB": _A100_80GB,
    "A30-24GB": _table(("1g.6gb", 5836, 4), ("2g.12gb", 11672, 2), ("4g.24gb", 23344, 1)),
}
"""GPU model -> its MIG profiles (DESIGN.md §7)."""


def _known() -> dict[str, MigProfile]:
    known: dict[str, MigProfile] = {}
    for profiles in CATALOGUE.values():
        for profile in profiles:
            seen = known.get(profile.name)
            # One name has one memory size on every model; instances differ, keep the most.
            if seen is None or profile.max_instances > seen.max_instances:
                known[profile.name] = profile
    return known


KNOWN_PROFILES: Mapping[str, MigProfile] = _known()


def catalogue_for_product(product: str) -> tuple[MigProfile, ...]:
    """Profiles for a GFD ``nvidia.com/gpu.product`` (``NVIDIA-A100-SXM4-80GB``...);
    empty for a GPU the table does not know (an H100 NVL 94GB has other profiles)."""
    text = product.upper()
    if "A100" in text:
        return CATALOGUE["A100-80GB" if "80GB" in text else "A100-40GB"]
    if "H100" in text and "80GB" in text:
        return CATALOGUE["H100-80GB"]
    if "A30" in text:
        return CATALOGUE["A30-24GB"]
    return ()


def estimated_memory_mib(name: str) -> int:
    """Memory of a profile nothing describes, from its name, on the low side."""
    return parse_profile_name(name)[1] * _UNKNOWN_MIB_PER_GB


@dataclass(frozen=True)
class OfferedProfile:
    name: str
    memory_mib: int
    instances: int
    """Sum of the nodes' capacity for this profile."""


@dataclass(frozen=True)
class MigOffer:
    """The MIG profiles the cluster's nodes advertise, with their memory."""

    profiles: Mapping[str, OfferedProfile] = field(default_factory=dict)

    @classmethod
    def from_nodes(cls, nodes: Iterable[Mapping[str, Any]]) -> "MigOffer":
        """From Node objects as JSON dicts; malformed parts of a node are skipped.

        A profile's memory is the least any node offering it gives it (its label,
        else the table): one name can have several sizes (DESIGN.md §7), and the pod
        may be placed on any of those nodes' slices."""
        instances: dict[str, int] = {}
        memory: dict[str, int] = {}
        for node in nodes:
            metadata = _mapping(node, "metadata")
            labelled: dict[str, int] = {}
            for key, value in _mapping(metadata, "labels").items():
                match = _LABEL.match(key)
                name = (
                    profile_from_resource(MIG_PREFIX + match["resource"])
                    if match and not is_time_sliced(MIG_PREFIX + match["resource"])
                    else None
                )
                mib = _whole(value)
                if match and name and match["attr"] == "memory" and mib:
                    labelled[name] = mib
            for resource, amount in _mapping(_mapping(node, "status"), "capacity").items():
                # A time-sliced slice (``nvidia.com/mig-1g.10gb.shared``) is no profile
                # to place a pod on: the pods sharing it share its memory.
                if is_time_sliced(resource):
                    continue
                name = profile_from_resource(resource)
                count = _whole(amount)
                if name is not None and count:
                    instances[name] = instances.get(name, 0) + count
                    mib = labelled.get(name) or memory_mib(name)
                    memory[name] = min(memory.get(name, mib), mib)
        return cls(
            {
                name: OfferedProfile(name, memory[name], count)
                for name, count in sorted(instances.items())
            }
        )

    def offers(self, name: str) -> bool:
        return name in self.profiles


def memory_mib(name: str, offer: MigOffer | None = None) -> int:
    """Advertised memory first, then the table, then a low estimate from the name."""
    described = described_memory_mib(name, offer)
    return estimated_memory_mib(name) if described is None else described


def described_memory_mib(name: str, offer: MigOffer | None = None) -> int | None:
    """Advertised memory first, then the table; None for a profile neither describes."""
    if offer is not None and name in offer.profiles:
        return offer.profiles[name].memory_mib
    if name in KNOWN_PROFILES:
        return KNOWN_PROFILES[name].memory_mib
    # A variant (``+me`` adds media engines) has its base profile's memory.
    base = _NAME.sub(r"\g<slices>g.\g<gb>gb", name)
    if base in KNOWN_PROFILES:
        return KNOWN_PROFILES[base].memory_mib
    return None


def _mapping(parent: object, key: str) -> Mapping[str, Any]:
    value = parent.get(key) if isinstance(parent, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _whole(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.isascii() and value.isdecimal() and len(value) < 10:
        return int(value)
    return 0


@dataclass(frozen=True)
class MigChoice:
    profile: str | None
    """None when nothing may be chosen; ``reason`` then says why."""
    memory_mib: int = 0
    reason: str = ""
    """For a refusal, the denial; for a choice, a warning worth showing (or "")."""


def choose_profile(
    declared_bytes: int,
    *,
    allowed: Sequence[str],
    fallback: Literal["larger", "deny"],
    offer: MigOffer | None,
) -> MigChoice:
    """The smallest allowed profile with at least ``declared_bytes`` of memory.

    Smallest means least memory, then fewest compute slices. With a cluster
    view (``offer``), a profile no node advertises is passed over for the next
    larger advertised one (``fallback: larger``) or refused (``deny``).
    """
    # No allow-list: what the cluster offers, or without a cluster view, the whole table.
    names = list(allowed) or list(offer.profiles if offer and offer.profiles else KNOWN_PROFILES)
    ranked = sorted(
        (MigProfile(name, memory_mib(name, offer)) for name in set(names)),
        key=lambda p: (p.memory_mib, p.slices, p.name),
    )
    if not ranked:
        return MigChoice(None, reason="no MIG profile is allowed")
    fits = [p for p in ranked if p.memory_bytes >= declared_bytes]
    if not fits:
        largest = ranked[-1]
        return MigChoice(
            None,
            reason=(
                f"no allowed MIG profile has {format_bytes(declared_bytes)} "
                f"(largest: {largest.name}, {largest.memory_mib}Mi)"
            ),
        )
    best = fits[0]
    if offer is None or offer.offers(best.name):
        return MigChoice(best.name, best.memory_mib)
    if fallback == "deny":
        return MigChoice(
            None, reason=f"no node offers {best.resource} (policy mig.fallback is deny)"
        )
    offered = [p for p in fits if offer.offers(p.name)]
    if offered:
        larger = offered[0]
        note = f"no node offers {best.name}; using larger {larger.name}"
        return MigChoice(larger.name, larger.memory_mib, note)
    return MigChoice(best.name, best.memory_mib, f"no node offers {best.resource} yet")
