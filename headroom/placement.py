"""Whether a pod fits a node's account, and how well: the extender's filter and score.

Fit is the accounting's rule (:mod:`headroom.accounting`): a shared pod needs its
declared memory free on the node's tightest GPU; a MIG pod needs a free slice
of each profile it asks for. Reasons are written for people reading
``kubectl describe pod``: the GPU, its headroom, the declaration, and why the
figures are only declarations when the node agent's report is missing.

Scores are 0..10 (the extender protocol's range) and depend on one node only,
so prioritizing N nodes is O(N): the fraction of the tightest GPU left free
after placing the pod; ``spread`` prefers more left, ``binpack`` less.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from headroom.accounting import NodeAccount
from headroom.claims import Placement, PodClaim
from headroom.names import GPU_MEMORY, GPU_SHARED, mig_resource
from headroom.quantity import human_bytes

MAX_SCORE = 10


@dataclass(frozen=True)
class Fit:
    fits: bool
    reason: str = ""


FITS = Fit(True)
LEGACY = (
    f"legacy pod: asks {GPU_SHARED} but declares no {GPU_MEMORY} resource "
    "(admitted by Headroom 0.1); recreate it through the webhook, e.g. kubectl rollout restart"
)


def fit(account: NodeAccount, claim: PodClaim) -> Fit:
    """Whether ``claim`` fits ``account``'s node now; the reason when it does not."""
    if claim.problem:
        return Fit(False, claim.problem)
    if claim.shared:
        shared = _fit_shared(account, claim)
        if not shared.fits:
            return shared
    for profile, count in claim.mig.items():
        slices = account.mig.get(profile)
        if slices is None:
            return Fit(False, f"node offers no {mig_resource(profile)}")
        if count > slices.free:
            return Fit(
                False,
                f"MIG {profile}: {slices.used} of {slices.capacity} slices in use, {count} wanted",
            )
    return FITS


def _fit_shared(account: NodeAccount, claim: PodClaim) -> Fit:
    if account.tightest is None:
        why = account.note or "no GPUs known"
        return Fit(False, _with_note(f"node has no GPU for {GPU_SHARED}", why))
    if claim.legacy:
        # Admitted by Headroom 0.1 (annotation only): nothing immutable says how
        # much it uses, and once bound it is charged the whole GPU; refuse it
        # with the fix rather than place it on a guess.
        return Fit(False, LEGACY)
    if claim.shared > 1:
        # Replicas the device plugin spreads over GPUs: charged on every one of them.
        if claim.need <= account.everywhere_headroom:
            return FITS
        text = (
            f"{claim.shared} replicas, each GPU charged: {human_bytes(account.everywhere_headroom)}"
            f" headroom on the fullest < {claim.need_text} declared"
        )
        return Fit(False, _with_note(text, account.note))
    if claim.need <= account.shared_headroom:
        return FITS
    text = (
        f"{account.tightest_label}: {account.shared_headroom_text} headroom < "
        f"{claim.need_text} declared"
    )
    return Fit(False, _with_note(text, account.note))


def score(account: NodeAccount, claim: PodClaim, placement: Placement | None = None) -> int:
    """0..10 for a node the pod fits; 0 for one it does not or a pod with no GPU claim."""
    how = placement or claim.placement
    fractions: list[float] = []
    if claim.shared:
        left = shared_fraction_left(account, claim.need)
        if left is None:
            return 0
        fractions.append(left)
    for profile, count in claim.mig.items():
        slices = account.mig.get(profile)
        if slices is None or slices.capacity <= 0 or count > slices.free:
            return 0
        fractions.append((slices.free - count) / slices.capacity)
    if not fractions:
        return 0
    return scaled(min(fractions), how)


def shared_fraction_left(account: NodeAccount, need: int) -> float | None:
    """Share of the tightest GPU left free after placing ``need`` bytes; None if it won't fit."""
    room = account.shared_headroom - need
    total = account.shared_total
    if room < 0 or total <= 0:
        return None
    return room / total


def shared_scores(figures: Iterable[tuple[int, int] | None], need: int, spread: bool) -> list[int]:
    """:func:`score` of a shared-only pod on many nodes from their flat figures: the hot path.

    Each of ``figures`` is a node's :attr:`NodeAccount.shared_headroom` and
    :attr:`NodeAccount.shared_total`, or None for a node the cache does not
    hold (scored 0). One loop with no call per node: at thousands of nodes a
    function call each costs as much as the arithmetic.
    """
    values = []
    for entry in figures:
        value = 0
        if entry is not None:
            left, scale = entry[0] - need, entry[1]
            if 0 <= left <= scale and scale > 0:
                value = round(MAX_SCORE * left / scale)
                if not spread:
                    value = MAX_SCORE - value
        values.append(value)
    return values


def scaled(left: float, how: Placement) -> int:
    """A fraction left free -> 0..10: ``spread`` prefers more left, ``binpack`` less."""
    spread = round(MAX_SCORE * min(1.0, max(0.0, left)))
    return spread if how == "spread" else MAX_SCORE - spread


def _with_note(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text
