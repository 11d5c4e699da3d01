"""How many not-yet-located pods the NVIDIA device plugin can have put on one GPU.

A shared pod is *located* once the node agent's report places it on a GPU.
Between its bind and that report, Headroom 0.1 charged it to every GPU of its
node, so an 8-GPU node held what one GPU holds (issue 8: 400 of 1,000 pods bound
on 100 eight-GPU nodes). But kubelet does not pick the GPU at random: it asks
the device plugin's ``GetPreferredAllocation``, and for replicated (time-sliced
or MPS) resources the NVIDIA device plugin answers with its ``distributed``
policy, the default (NVIDIA/k8s-device-plugin ``internal/rm/allocate.go``,
``greedyAlloc`` with the ``AllocationPolicyDistributed`` comparator, called from
``internal/rm/nvml_manager.go`` ``getPreferredAllocation``): each replica goes
to a GPU with the *fewest replicas allocated* at that moment.

That gives a bound that holds whatever the order of allocations. Say ``x_g``
of the ``k`` unlocated replicas are on GPU ``g`` now (``x_g >= 1``), beside
``o_g`` located ones. When the last of those ``x_g + o_g`` was allocated (an
unlocated one, or a located one after them: either way after the oldest
unlocated pod was created), ``g`` already held the other ``x_g + o_g - 1``,
and every other GPU ``h``
held no fewer than ``g`` (or was full, and then held more anyway). What ``h``
held then is on ``h`` now, or has left since: at most ``c_h + x_h + e_h``,
where ``c_h`` is its located replicas now (a replica the report shows held by
a pod the cache does not know included: ``headroom.accounting.foreign_replicas``)
plus the located replicas that left it since the oldest unlocated pod was
created, ``x_h`` its unlocated replicas now, and ``e_h`` its share of the
``D`` replicas that left unlocated (from any GPU: spread as suits the worst
case, ``Σ e_h <= D``). So
``x_g - 1 + o_g <= c_h + x_h + e_h`` for every other GPU, the ``x_h`` sum to
``k - x_g``, and the most ``x_g`` can be satisfies

    x_g + max(0, Σ_{h≠g} max(0, x_g - 1 + o_g - c_h) - D) <= k

A pod the filter asks about counts as one more unlocated replica: the
extender admits it where it fits beside what could be on each GPU with it.

``o_g`` must count only pods kubelet still holds allocated on ``g``. The report
lags kubelet (it frees a pod's replica when its containers end), and a located
pod may leave before kubelet admits the next one; so the accounting evaluates
the bound for every ``o_g - j`` and charges the worst, with those ``j`` pods'
memory gone too (``headroom.accounting._cap``). A pod gone from another GPU
``h`` while still counted in ``c_h`` only raises the bound.

:func:`most_on_gpu` is the largest ``x_g`` that satisfies it. The accounting
charges each GPU the largest ``x_g`` of the unlocated single-replica pods
(an unlocated multi-replica pod stays charged on every GPU; a located one is
``o_g`` or ``c_h`` replicas where it holds them, its replicas leaving together). The bound needs the
departures: without their history (an extender restarted after the pod was
created) the pod is charged everywhere, as before.

A GPU holds at most its replicas ``R`` at once, its
located pods still allocated among them: ``x_g <= R - o_g``, taken where the
node's labels and the device plugin's capacity agree on ``R``
(``headroom.nodes.NodeGPUs.replicas_per_gpu``), with the history or without.

kubelet's Topology Manager, when on, offers the plugin only one NUMA node's
replicas (the lowest with one free, for a one-replica pod): the allocator then
picks the fewest among that node's GPUs only, so the argument holds per NUMA
node, and the accounting passes ``others`` for the GPU's own NUMA node only
(``headroom.accounting.numa_groups``, from the agent's report).

Not covered, and charged conservatively by nothing else: a device plugin
configured with ``sharedDevicesAllocationPolicy: packed`` (newer releases), and
GPUs marked unhealthy (the allocator skips them). The README says so.
"""

from collections.abc import Mapping, Sequence


def most_on_gpu(
    gpu: int, unlocated: int, others: Mapping[int, int], anywhere: int = 0, own: int = 0
) -> int:
    """The most of ``unlocated`` replicas that can be on ``gpu``.

    ``others`` maps every other shared GPU of the node to ``c_h``: its located
    replicas now plus the located ones that left it since the oldest unlocated
    pod was created; ``anywhere`` counts the replicas that left unlocated since
    then; ``own`` counts ``gpu``'s located replicas. A GPU missing from ``others``
    bounds nothing.
    """
    return most_with_gone(gpu, unlocated, others, anywhere, own)[0]


def most_with_gone(
    gpu: int,
    unlocated: int,
    others: Mapping[int, int],
    anywhere: int,
    own: int,
    least: Sequence[int] = (),
) -> tuple[int, ...]:
    """:func:`most_on_gpu` with ``j`` of ``gpu``'s located replicas gone, for ``j`` in
    ``0..own``: ``own - j`` in the bound. ``least[j]``, where given, is a count known
    to satisfy the bound for that ``j`` (the answer with fewer ``unlocated``).

    Fewer located only ever allow more, so each search starts where the last
    ended. The bound's left side grows with every replica more (by one, and the
    shortfall never falls), so the counts that satisfy it from there on are a
    run: its end is searched by halves, ``O(log unlocated)`` sums per ``j``, and
    with no other GPU to bound it (a NUMA node of one GPU, a node with no
    report yet) it is ``unlocated`` itself. An 8-GPU node's account asks twice
    per GPU.
    """
    bounds = [count for index, count in others.items() if index != gpu]
    if not bounds:
        return (unlocated,) * (own + 1)
    result = []
    most = 0
    for j in range(own + 1):
        below = own - j - 1  # level = more - 1 + (own - j)
        most = min(max(most, least[j] if j < len(least) else 0), unlocated)
        low, high = most, unlocated  # ``low`` stands; the most is in low..high
        while low < high:
            more = (low + high + 1) // 2
            level = more + below
            short = sum(level - count for count in bounds if count < level)
            if more + max(0, short - anywhere) > unlocated:
                high = more - 1
            else:
                low = more
        most = low
        result.append(most)
    return tuple(result)
