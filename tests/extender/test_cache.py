"""The extender's readiness: synced watches, and none blind for long."""

import time

from extender.cache import BLIND_LIMIT_SECONDS, Caches
from extender.state import ClusterState
from kube.config import Credentials
from kube.rest import Rest


async def test_not_ready_while_a_watch_has_been_blind_too_long() -> None:
    rest = Rest(Credentials(server="http://127.0.0.1:1"), timeout=1.0)
    caches = Caches(rest, ClusterState(margin=0, stale_after=90.0))
    await rest.close()
    assert not caches.ready()  # nothing listed yet
    for informer in caches.informers:
        informer.synced.set()
    assert caches.ready()
    pods = caches.informers[1]
    pods.failing_since = time.monotonic() - 1  # the apiserver just went away: a blip
    assert caches.ready()
    pods.failing_since = time.monotonic() - BLIND_LIMIT_SECONDS - 1
    assert not caches.ready()  # issue 7: 23 s of a down apiserver kept /readyz at 200
    pods.failing_since = None  # re-listed
    assert caches.ready()
