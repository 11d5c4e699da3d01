"""`headroom demo`: seed 001 on a live cluster, before and after Headroom, judged.

BEFORE runs the three workloads as stock time-slicing users write them, pinned
to one time-sliced A100 in a namespace without a policy; AFTER runs them as
Headroom users write them, in a namespace labelled with the scenario's policy
(``guard: evict``). Both phases record the agents' reports; the result is the
table, the plot, and the verdict's list of problems (empty when the story
happened: stock time-slicing starved someone, Headroom starved no one).
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from devcluster import scenario
from devcluster.demo_plot import write_plot
from devcluster.nodes import KWOK_ANNOTATION
from devcluster.outcome import Expectation, render_table, stand_ins, starved, verdict
from devcluster.phase import (
    Apis,
    DemoError,
    delete_namespace,
    raw,
    run_phase,
    wait_namespace_gone,
)
from devcluster.timeline import PhaseTimeline
from headroom import names
from headroom.reports import parse_report
from kube.config import api_client

REPORT_TIMEOUT = 60.0
REPORT_FRESH_SECONDS = 45.0
TITLE = "seed 001: a simulation, an inference service and a leaking notebook on one A100 40GB"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class DemoOptions:
    kubeconfig: Path | None
    duration: float = scenario.REFERENCE_SECONDS
    output: Path = Path("demo-output") / "seed001.png"
    scenario_file: Path = scenario.SEED001
    namespace_prefix: str = "seed001"
    keep: bool = False
    """Leave the AFTER namespace running (for ``kubectl`` after the demo)."""


@dataclass
class DemoResult:
    phases: list[PhaseTimeline]
    problems: list[str]
    table: str
    plot: Path
    node: str
    seconds: float
    victims: list[str]
    """Workloads the leak OOM-starved BEFORE (the leaker itself not counted)."""
    leaker: str
    guard: str
    stand_ins: list[str]
    """What in this run was not real (simulated GPU memory, KWOK nodes), to say so."""


def run(options: DemoOptions, progress: Progress) -> DemoResult:
    """Both phases, then the verdict; DemoError when the demo could not run at all."""
    begun = time.monotonic()
    story = scenario.load(options.scenario_file, duration=options.duration)
    apis = Apis.of(api_client(str(options.kubeconfig) if options.kubeconfig else None))
    try:
        nodes = raw(apis.core.list_node).get("items") or []
        node = pick_node(nodes)
        described = describe_node(next(n for n in nodes if n["metadata"]["name"] == node))
        progress(f"BEFORE runs on {node}: {described}")
        wait_for_report(apis, node, progress)
        install_policy(apis, story.policy)
        progress(f"policy {story.policy_name} installed (guard: {story.guard})")

        before_ns = f"{options.namespace_prefix}-before"
        after_ns = f"{options.namespace_prefix}-after"
        # `--keep` leaves the AFTER namespace running, a killed run either: their pods
        # would hold replicas and memory of the GPUs the BEFORE phase runs on.
        for ns in (before_ns, after_ns):
            wait_namespace_gone(apis, ns, progress)
        progress(f"phase BEFORE ({options.duration:.0f}s): stock time-slicing, no policy")
        before = run_phase(
            apis,
            PhaseTimeline("before", f"stock time-slicing, all on {node}, no policy"),
            namespace=scenario.namespace(before_ns, policy=None),
            deployments=scenario.before_deployments(story, before_ns, node=node),
            duration=options.duration,
            progress=progress,
        )
        delete_namespace(apis, before_ns, progress)

        progress(f"phase AFTER ({options.duration:.0f}s): Headroom policy {story.policy_name}")
        after = run_phase(
            apis,
            PhaseTimeline("after", f"Headroom, policy {story.policy_name} (guard {story.guard})"),
            namespace=scenario.namespace(after_ns, policy=story.policy_name),
            deployments=scenario.after_deployments(story, after_ns),
            duration=options.duration,
            progress=progress,
        )
        if options.keep:
            progress(f"kept namespace {after_ns}: kubectl get pods,events -n {after_ns}")
        else:
            delete_namespace(apis, after_ns, progress)
    except HTTPError as err:
        raise DemoError(f"lost the API server: {err}") from err
    except ApiException as err:
        raise DemoError(
            f"the API server refused a demo request: {err.status} {err.reason}: {_message(err)}"
        ) from err
    phases = [before, after]
    expect = Expectation(story.workloads, story.leaker, story.guard)
    fakes = stand_ins(phases, kwok_nodes=kwok_nodes(nodes))
    try:
        plot = write_plot(phases, options.output, title="\n".join([TITLE, *fakes]))
    except ImportError as err:
        raise DemoError(
            f"the plot needs matplotlib: pip install 'gpu-headroom[demo]' ({err})"
        ) from err
    except OSError as err:
        raise DemoError(f"cannot write the plot to {options.output}: {err}") from err
    return DemoResult(
        phases=phases,
        problems=verdict(before, after, expect),
        table=render_table(phases),
        plot=plot,
        node=node,
        seconds=time.monotonic() - begun,
        victims=sorted(set(starved(before)) - {story.leaker}),
        leaker=story.leaker,
        guard=story.guard,
        stand_ins=fakes,
    )


def pick_node(nodes: list[dict[str, Any]]) -> str:
    """The BEFORE node: a time-sliced GPU node with the most memory per GPU (seed 001's A100)."""
    candidates = []
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if labels.get(names.LABEL_SHARING_STRATEGY) != "time-slicing":
            continue
        if names.GPU_SHARED not in allocatable:
            continue
        try:
            memory = int(labels.get(names.LABEL_MEMORY_MIB, "0"))
        except ValueError:
            continue
        candidates.append((-memory, str(node["metadata"]["name"])))
    if not candidates:
        raise DemoError(
            f"no node advertises {names.GPU_SHARED} with "
            f"{names.LABEL_SHARING_STRATEGY}=time-slicing; the demo needs a time-sliced GPU node"
        )
    return min(candidates)[1]


def describe_node(node: dict[str, Any]) -> str:
    """The BEFORE node as its labels describe it, and whether it is a KWOK stand-in."""
    labels = node["metadata"].get("labels") or {}
    product = labels.get(names.LABEL_PRODUCT) or "GPU of unknown product"
    memory = labels.get(names.LABEL_MEMORY_MIB, "?")
    what = f"a time-sliced {product} ({memory} MiB per GPU)"
    if node["metadata"]["name"] in kwok_nodes([node]):
        return f"a KWOK node labelled as {what}"
    return what


def kwok_nodes(nodes: list[dict[str, Any]]) -> set[str]:
    """The nodes KWOK manages: no kubelet, so no container of theirs ever runs."""
    return {
        str(node["metadata"]["name"])
        for node in nodes
        if (node["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) == "fake"
    }


def wait_for_report(apis: Apis, node: str, progress: Progress) -> None:
    """The agent of ``node`` must be reporting, or nothing could be observed."""
    deadline = time.monotonic() + REPORT_TIMEOUT
    said = False
    while True:
        try:
            obj = raw(
                apis.custom.get_cluster_custom_object,
                names.GROUP,
                names.VERSION,
                names.REPORT_PLURAL,
                node,
            )
            age = parse_report(obj).age_seconds(datetime.now(UTC))
            if age < REPORT_FRESH_SECONDS:
                return
            why = f"its last report is {age:.0f}s old"
        except ApiException as err:
            if err.status != 404:
                raise
            why = f"no {names.REPORT_KIND} {node} yet"
        except ValidationError as err:
            why = f"its report is invalid: {err.errors()[0]['msg']}"
        if time.monotonic() > deadline:
            raise DemoError(
                f"the agent on {node} is not reporting ({why}); is the simulated agent running? "
                "(`headroom cluster status`)"
            )
        if not said:
            progress(f"waiting for the agent on {node} ({why})")
            said = True
        time.sleep(1.0)


def install_policy(apis: Apis, policy: dict[str, Any]) -> None:
    """Create the scenario's policy, or replace an older copy of it."""
    name = str(policy["metadata"]["name"])
    try:
        current = raw(
            apis.custom.get_cluster_custom_object,
            names.GROUP,
            names.VERSION,
            names.POLICY_PLURAL,
            name,
        )
    except ApiException as err:
        if err.status != 404:
            raise
        apis.custom.create_cluster_custom_object(
            names.GROUP, names.VERSION, names.POLICY_PLURAL, policy
        )
        return
    body = {**policy, "metadata": {**policy["metadata"], **_version_of(current)}}
    apis.custom.replace_cluster_custom_object(
        names.GROUP, names.VERSION, names.POLICY_PLURAL, name, body
    )


def _version_of(obj: dict[str, Any]) -> dict[str, str]:
    return {"resourceVersion": str(obj["metadata"]["resourceVersion"])}


def _message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "{}").get("message") or err.body)
    except (ValueError, AttributeError):
        return str(err.body)


__all__ = [
    "DemoError",
    "DemoOptions",
    "DemoResult",
    "describe_node",
    "kwok_nodes",
    "pick_node",
    "run",
]
