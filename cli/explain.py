"""``headroom explain``: what the webhook would do to a pod, offline.

Runs :func:`headroom.mutation.decide`, the webhook's own decision, on a pod or
on the pod template of a workload, with policies read from files. Exit code 0
when the pod is allowed, 1 when it is denied, 2 when the input is unusable.
"""

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from headroom import names
from headroom.mig import MigOffer
from headroom.mutation import Decision, decide
from headroom.policy import (
    GPUSharingPolicy,
    PolicyError,
    index_policies,
    load_policies,
    yaml_error,
)

TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}
"""Where each workload kind keeps the pod it creates."""


class InputError(Exception):
    """A file or argument ``explain`` cannot use; exit code 2."""


class _ManifestLoader(yaml.SafeLoader):
    """YAML as the apiserver reads a manifest: an unquoted timestamp stays a string.

    ``kubectl get -o yaml`` writes ``creationTimestamp: 2024-05-01T10:00:00Z``;
    SafeLoader would make it a ``datetime``, which JSON output cannot carry.
    """


_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show what Headroom would do to a pod (offline, same decision as the webhook)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        required=True,
        metavar="FILE",
        help="a Pod, or a Deployment/ReplicaSet/StatefulSet/DaemonSet/Job/CronJob; - for stdin",
    )
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help="namespace the pod is created in (default: the manifest's, else default)",
    )
    parser.add_argument(
        "--namespace-labels",
        nargs="+",
        action="extend",
        default=[],
        metavar="K=V",
        help="the namespace's labels; without this flag and with exactly one --policy, "
        "headroom.dev/policy=<that policy>; labels given without headroom.dev/policy "
        "explain an unlabelled namespace (the webhook leaves its pods alone)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="FILE",
        help="GPUSharingPolicy YAML (repeatable; multi-document files allowed)",
    )
    parser.add_argument(
        "--nodes",
        metavar="FILE",
        help="Node objects (YAML list or documents) whose MIG profiles the cluster offers",
    )
    parser.add_argument("--output", "-o", choices=["text", "json"], default="text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        manifest = _one_object(_read(args.filename), args.filename)
        pod, source = pod_of(manifest)
        policies = index_policies(policy for path in args.policy for policy in _policies(path))
        labels = _labels(args.namespace_labels, policies)
        offer = MigOffer.from_nodes(_nodes(args.nodes)) if args.nodes else None
    except (InputError, PolicyError) as err:
        print(f"headroom explain: {err}", file=sys.stderr)
        return 2
    namespace = args.namespace or _namespace_of(manifest)
    decision = decide(
        pod, namespace=namespace, namespace_labels=labels, policies=policies, offered_mig=offer
    )
    result = jsonpatch.apply_patch(pod, decision.patch) if decision.patch else pod
    if args.output == "json":
        print(json.dumps(_as_json(decision, result)))
    else:
        print(render_text(decision, result, source=source, namespace=namespace, labels=labels))
    return 0 if decision.allowed else 1


def pod_of(manifest: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The pod a manifest creates, and a few words on where it came from."""
    kind, name = manifest.get("kind"), _name_of(manifest)
    if kind == "Pod":
        return dict(manifest), f"Pod {name}"
    if not isinstance(kind, str) or kind not in TEMPLATE_PATHS:
        known = ", ".join(["Pod", *TEMPLATE_PATHS])
        raise InputError(f"kind {kind!r} has no pod to explain (expected one of {known})")
    template: Any = manifest
    for key in TEMPLATE_PATHS[kind]:
        template = template.get(key) if isinstance(template, Mapping) else None
    if not isinstance(template, Mapping):
        raise InputError(f"{kind} {name}: no pod template at .{'.'.join(TEMPLATE_PATHS[kind])}")
    metadata = template.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    # Controllers create pods with generateName and no name; the webhook sees them so.
    metadata.setdefault("generateName", f"{name}-")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template.get("spec")}
    return pod, f"pod template of {kind} {name}"


def render_text(
    decision: Decision,
    pod: Mapping[str, Any],
    *,
    source: str,
    namespace: str,
    labels: Mapping[str, str],
) -> str:
    verdict = "allowed" if decision.allowed else "DENIED"
    policy_label = labels.get(names.LABEL_POLICY)
    lines = [
        f"Pod:       {source}, namespace {namespace}",
        f"Policy:    {policy_label or '(namespace has no ' + names.LABEL_POLICY + ' label)'}",
        f"Decision:  {verdict} ({decision.outcome}): {decision.message}",
    ]
    if decision.warnings:
        lines += ["", "Warnings (kubectl shows these):"]
        lines += [f"  {warning}" for warning in decision.warnings]
    if decision.annotations:
        lines += ["", "Annotations recorded:"]
        lines += [f"  {key}: {value}" for key, value in decision.annotations.items()]
    if decision.patch:
        lines += ["", f"Patch ({len(decision.patch)} operations, RFC 6902):"]
        for op in decision.patch:
            value = f" {json.dumps(op['value'])}" if "value" in op else ""
            lines.append(f"  {op['op']:<8} {op['path']}{value}")
        lines += ["", "Mutated pod:", "---", yaml.safe_dump(pod, sort_keys=False).rstrip()]
    else:
        lines += ["", "No patch: the pod is created as it is."]
    return "\n".join(lines)


def _as_json(decision: Decision, pod: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "allowed": decision.allowed,
        "message": decision.message,
        "warnings": decision.warnings,
        "patch": decision.patch,
        "pod": pod,
    }


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise InputError(f"{path}: no such file") from err
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from err


def _policies(path: str) -> list[GPUSharingPolicy]:
    try:
        found = load_policies(_read(path))
    except PolicyError as err:
        raise InputError(f"{path}: {err}") from err
    if not found:
        raise InputError(f"{path}: no {names.POLICY_KIND} in it")
    return found


def _nodes(path: str) -> list[dict[str, Any]]:
    """Node objects; ``kind`` may be left out, but another kind is a wrong file."""
    nodes = _objects(_read(path), path)
    for number, node in enumerate(nodes, start=1):
        if not isinstance(node, dict):
            raise InputError(f"{path}: document {number} is not an object")
        if node.get("kind", "Node") != "Node":
            raise InputError(f"{path}: document {number} is a {node['kind']}, not a Node")
    return nodes


def _objects(text: str, where: str) -> list[Any]:
    try:
        documents = [doc for doc in yaml.load_all(text, _ManifestLoader) if doc is not None]
    except yaml.YAMLError as err:
        raise InputError(f"{where}: {yaml_error(err)}") from err
    flat: list[Any] = []
    for document in documents:
        items = document.get("items") if isinstance(document, dict) else None
        flat.extend(items if isinstance(items, list) else [document])
    return flat


def _one_object(text: str, where: str) -> dict[str, Any]:
    objects = _objects(text, where)
    if len(objects) != 1:
        raise InputError(f"{where}: expected one Kubernetes object, found {len(objects)}")
    if not isinstance(objects[0], dict):
        found = type(objects[0]).__name__
        raise InputError(f"{where}: expected a Kubernetes object, found a {found}")
    return objects[0]


def _labels(pairs: list[str], policies: Mapping[str, GPUSharingPolicy]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in (item for arg in pairs for item in arg.split(",") if item):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--namespace-labels: {pair!r} is not KEY=VALUE")
        labels[key] = value
    # Only a bare command line means "the namespace of this one policy"; labels
    # given without the policy label describe an unlabelled namespace, which
    # the webhook leaves alone.
    if not labels and len(policies) == 1:
        labels[names.LABEL_POLICY] = next(iter(policies))
    return labels


def _name_of(manifest: Mapping[str, Any]) -> str:
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) and name else "(unnamed)"


def _namespace_of(manifest: Mapping[str, Any]) -> str:
    metadata = manifest.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return namespace if isinstance(namespace, str) and namespace else "default"
