"""manifests/components/monitoring against the code: every alert reads metrics (and
labels) the components really export, every alert says what to check, and every
PodMonitor finds a port the workloads in manifests/base really have.

The names come from the components' own registries, built as the processes build
them: rename a metric, or one of its labels, and this fails.
"""

import ast
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agent.server import AgentMetrics
from devcluster.binaries import BUILD_SCRIPT, bin_dir, rulecheck_tool
from extender.server import OUTCOMES
from extender.server import Metrics as ExtenderMetrics
from extender.state import ClusterState
from extender.verbs import Extender
from serving.site import ConnectionMetrics
from tests.e2e.outcomes import skip_or_fail
from webhook.metrics import WebhookMetrics

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "manifests/components/monitoring"
BASE = ROOT / "manifests/base"
SEVERITIES = {"critical", "warning", "info"}
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "node"}
"""Labels Prometheus adds to every sample a PodMonitor scrapes (``node``: its relabeling)."""
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset",
}  # fmt: skip


async def _binds_nothing(namespace: str, name: str, uid: str, node: str) -> None:
    raise AssertionError("no bind is made here")


def registries() -> list[CollectorRegistry]:
    webhook = WebhookMetrics()
    extender = ExtenderMetrics(Extender(ClusterState(margin=0, stale_after=90.0), _binds_nothing))
    agent = AgentMetrics()
    # serving.site adds these to each registry, as the processes start their ports.
    ConnectionMetrics("webhook", webhook.registry, tls=True)
    ConnectionMetrics("extender", extender.registry)
    ConnectionMetrics("agent", agent.registry)
    return [webhook.registry, extender.registry, agent.registry]


def exported() -> dict[str, set[str]]:
    """Every sample name the three components can export -> the labels it carries."""
    names: dict[str, set[str]] = {}
    for registry in registries():
        collectors = dict(registry._names_to_collectors)
        for family in registry.collect():
            collector = collectors.get(family.name) or collectors.get(family.name + "_total")
            labels = set(getattr(collector, "_labelnames", ()))
            labels.update(key for sample in family.samples for key in sample.labels)
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]


def alerts() -> Iterator[dict[str, Any]]:
    for rule in documents("prometheusrule.yaml"):
        for group in rule["spec"]["groups"]:
            yield from group["rules"]


def selectors(expr: str) -> Iterator[tuple[str, set[str]]]:
    """Each metric an expression reads, with the label names its matchers name; and
    each ``by (...)`` / ``without (...)`` / ``on (...)`` label list, as ("", labels)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\[[^\]]*\]", "", text)  # range durations
    for words in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        yield "", {w.strip() for w in words.split(",") if w.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    pattern = r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?"
    for name, matchers, call in re.findall(pattern, text):
        if call or name in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]?", name):
            continue  # a function or an aggregation, a keyword
        keys = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
        yield name, keys


def _outcomes_answered() -> dict[str, set[str]]:
    """The outcome labels extender/server.py's handlers give, by verb: the second item
    of each ``(response, outcome)`` they return, and each ``outcome = ...`` assigned
    (in ``handle``, for every verb)."""
    verbs = {"filter_": "filter", "prioritize": "prioritize", "bind": "bind", "preempt": "preempt"}
    found: dict[str, set[str]] = {verb: set() for verb in verbs.values()}
    tree = ast.parse((ROOT / "extender/server.py").read_text())

    def strings(node: ast.AST) -> set[str]:
        return {
            n.value
            for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }

    for function in ast.walk(tree):
        if not isinstance(function, ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if function.name in verbs and isinstance(node, ast.Return):
                value = node.value
                if isinstance(value, ast.Tuple) and len(value.elts) == 2:
                    found[verbs[function.name]] |= strings(value.elts[1])
            if function.name == "handle" and isinstance(node, ast.Assign):
                for target in node.targets:
                    names = target.elts if isinstance(target, ast.Tuple) else [target]
                    for i, name in enumerate(names):
                        if isinstance(name, ast.Name) and name.id == "outcome":
                            value = node.value
                            if isinstance(value, ast.Tuple):
                                value = value.elts[i]
                            for verb in found:
                                found[verb] |= strings(value)
    return found


def test_every_outcome_a_verb_answers_is_exported_from_the_start() -> None:
    # OUTCOMES is what the extender exports at 0; an outcome a handler gives that is
    # not in it would be a series an alert's rate() misses the first of.
    answered = _outcomes_answered()
    assert all(answered.values())
    for verb, outcomes in answered.items():
        assert outcomes <= set(OUTCOMES[verb]), (verb, outcomes - set(OUTCOMES[verb]))
        assert {"too-large", "internal-error"} <= outcomes


def test_the_metric_names_come_from_the_code() -> None:
    names = exported()
    # The ones the alerts rest on, so a registry that came back empty cannot pass.
    for name in (
        "headroom_extender_requests_total",
        "headroom_extender_answering",
        "headroom_extender_gpu_nodes_unmeasured",
        "headroom_agent_gpus_unread",
        "headroom_webhook_certificate_expiry_timestamp_seconds",
    ):
        assert name in names
    assert names["headroom_extender_requests_total"] == {"verb", "outcome"}
    assert names["headroom_extender_gpu_nodes_unmeasured"] == {"reason"}


def test_every_alert_reads_only_metrics_and_labels_the_code_exports() -> None:
    names = exported()
    read = set()
    for alert in alerts():
        for metric, labels in selectors(alert["expr"]):
            if not metric:
                allowed = set().union(*names.values()) | TARGET_LABELS
                assert labels <= allowed, (alert["alert"], labels - allowed)
                continue
            assert metric in names, f"{alert['alert']}: {metric} is exported by no component"
            unknown = labels - names[metric] - TARGET_LABELS
            assert not unknown, f"{alert['alert']}: {metric} has no label {unknown}"
            read.add(metric)
    assert len(read) >= 8, read


def test_a_renamed_metric_fails_the_check() -> None:
    names = exported()
    expr = 'sum(rate(headroom_extender_request_total{verb="bind"}[5m])) > 0'
    assert [m for m, _ in selectors(expr) if m and m not in names] == [
        "headroom_extender_request_total"
    ]


def test_every_alert_says_what_it_means_how_bad_and_for_how_long() -> None:
    seen = set()
    for alert in alerts():
        name = alert["alert"]
        assert name not in seen, name
        seen.add(name)
        assert re.fullmatch(r"\d+[smh]", str(alert.get("for", ""))), name
        assert alert.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = alert.get("annotations", {})
        assert annotations.get("summary", "").strip(), name
        assert len(annotations.get("description", "")) > 80, name  # says what to check
    assert {"HeadroomExtenderNotAnswering", "HeadroomGPUNodesUnmeasured"} <= seen


def _pod_template(relative: str) -> dict[str, Any]:
    template: dict[str, Any] = yaml.safe_load((BASE / relative).read_text())["spec"]["template"]
    return template


WORKLOADS = {
    "headroom-webhook": "webhook/deployment.yaml",
    "headroom-scheduler": "scheduler/deployment.yaml",
    "headroom-agent": "agent/daemonset.yaml",
}


def test_every_pod_monitor_finds_a_named_port_of_its_workload() -> None:
    monitors = documents("podmonitors.yaml")
    assert {m["kind"] for m in monitors} == {"PodMonitor"}
    found = set()
    for monitor in monitors:
        assert monitor["metadata"]["namespace"] == "headroom-system"
        selector = monitor["spec"]["selector"]["matchLabels"]
        template = _pod_template(WORKLOADS[selector["app.kubernetes.io/name"]])
        assert selector.items() <= template["metadata"]["labels"].items()
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports, (monitor["metadata"]["name"], endpoint["port"])
        found.add(selector["app.kubernetes.io/name"])
    assert found == set(WORKLOADS)


def test_the_extender_metrics_port_serves_metrics_only_and_the_verbs_stay_local() -> None:
    (extender,) = [
        c
        for c in _pod_template(WORKLOADS["headroom-scheduler"])["spec"]["containers"]
        if c["name"] == "extender"
    ]
    assert "--host=127.0.0.1" in extender["args"]
    (port,) = extender["ports"]
    assert f"--metrics-port={port['containerPort']}" in extender["args"]


def test_the_webhook_scrape_verifies_the_serving_certificate() -> None:
    (webhook,) = [
        m for m in documents("podmonitors.yaml") if m["metadata"]["name"] == "headroom-webhook"
    ]
    (endpoint,) = webhook["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert not tls.get("insecureSkipVerify")
    assert tls["serverName"] == "headroom-webhook.headroom-system.svc"  # what certs names
    volumes = _pod_template(WORKLOADS["headroom-webhook"])["spec"]["volumes"]
    secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert tls["ca"]["secret"]["name"] in secrets  # the Secret the webhook serves from


def _kubectl() -> str | None:
    built = bin_dir() / "kubectl"
    return str(built) if os.access(built, os.X_OK) else shutil.which("kubectl")


def test_rulecheck_is_rebuilt_when_its_sources_change(tmp_path: Path) -> None:
    # build.sh builds each tool once into a cache keyed by the Kubernetes and KWOK
    # versions: a rulecheck built before its main.go or its Prometheus changed would
    # go on answering, stale. Its name carries a digest of its sources, as build.sh
    # names it.
    tool = rulecheck_tool()
    assert tool.parent == bin_dir()
    assert tool.name.startswith("rulecheck-")
    sources = ROOT / "tests" / "e2e" / "controlplane" / "prometheus"
    script = BUILD_SCRIPT.read_text()
    assert 'rulecheck-$(sources_digest "$here/prometheus")' in script
    digest = subprocess.run(
        [
            "bash",
            "-c",
            f'source {BUILD_SCRIPT.parent / "lib.sh"}; sources_digest "$1"',
            "-",
            sources,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert tool.name == f"rulecheck-{digest}"
    copy = tmp_path / "prometheus"
    shutil.copytree(sources, copy)
    (copy / "rulecheck" / "main.go").write_text("package main\n")
    assert rulecheck_tool(copy) != tool


def _rulecheck(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Prometheus's own rule parser and engine (tests/e2e/controlplane/prometheus)."""
    tool = rulecheck_tool()
    if not os.access(tool, os.X_OK):
        skip_or_fail(f"rulecheck is not built: run {BUILD_SCRIPT} (or `make controlplane`)")
    argv = [str(tool), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_the_rules_pass_prometheus_own_check(tmp_path: Path) -> None:
    # What the Prometheus Operator hands Prometheus is the PrometheusRule's groups:
    # Prometheus parses them as `promtool check rules` does, and a rule file that
    # fails is not loaded at all, every alert of it silently gone.
    (rule,) = documents("prometheusrule.yaml")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = _rulecheck(path)
    assert result.returncode == 0, result.stderr
    groups = rule["spec"]["groups"]
    rules = sum(len(group["rules"]) for group in groups)
    assert result.stdout.strip() == f"{path}: {rules} rules in {len(groups)} groups"


def test_the_rule_check_refuses_what_prometheus_would(tmp_path: Path) -> None:
    # The check is not a formality: a type error PromQL's parser alone catches, and a
    # template that would fail only when the alert fires.
    path = tmp_path / "bad.yaml"
    bad = {
        "alert": "Broken",
        "expr": "rate(headroom_extender_requests_total) > 0",
        "annotations": {"summary": "{{ $labels.pod "},
    }
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [bad]}]}))
    result = _rulecheck(path)
    assert result.returncode == 1
    assert 'expected type range vector in call to function "rate"' in result.stderr
    assert 'annotation "summary"' in result.stderr


HEALTHY = {
    # Every series an alert reads, as a healthy cluster exports it (one sample a
    # minute for three hours, in promtool's notation): a webhook replica with 2 connections open,
    # one extender answering and its standby, one node's agent.
    'headroom_webhook_open_connections{pod="w"}': "2x180",
    'headroom_webhook_certificate_expiry_timestamp_seconds{pod="w"}': "7776000x180",
    'headroom_webhook_invalid_policies{pod="w"}': "0x180",
    'headroom_extender_answering{pod="s1"}': "1x180",
    'headroom_extender_answering{pod="s2"}': "0x180",
    'headroom_extender_requests_total{verb="filter",outcome="ok"}': "0+60x180",
    'headroom_extender_requests_total{verb="filter",outcome="error"}': "0x180",
    'headroom_extender_requests_total{verb="bind",outcome="ok"}': "0+60x180",
    'headroom_extender_requests_total{verb="bind",outcome="refused"}': "0+5x180",
    **{
        f'headroom_extender_gpu_nodes_unmeasured{{reason="{reason}"}}': "0x180"
        for reason in ("missing", "unknown-schema", "nvml-unavailable", "stale", "gpu-unread")
    },
    'headroom_agent_probe_available{node="n1"}': "1x180",
    'headroom_agent_gpus_unread{node="n1"}': "0x180",
    **{
        f'headroom_agent_guard_actions_total{{node="n1",kind="{kind}"}}': "0x180"
        for kind in ("event", "evict", "evict-refused", "delete", "error")
    },
}


def _firing(tmp_path: Path, changes: dict[str, str], *at: str) -> list[set[str]]:
    """The alerts firing at each of ``at`` (minutes into the healthy series with
    ``changes``: series given new values, fewer of them for a series gone), by Prometheus's
    engine and alerting rules evaluating every minute from 0 (rulecheck -eval)."""
    (rule,) = documents("prometheusrule.yaml")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    series = {**HEALTHY, **changes}
    scenario = {
        "interval": "1m",
        "series": [{"series": k, "values": v} for k, v in series.items()],
        "at": list(at),
    }
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    result = _rulecheck("-eval", path, rules)
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["at"] for a in answers] == list(at)
    # A template that parses but fails on the alert's values (a function given the
    # wrong type) passes the rule check; Prometheus sends its error as the annotation.
    for answer in answers:
        for alert in answer["firing"]:
            for name, text in alert["annotations"].items():
                assert "<error expanding template" not in text, (alert["alert"], name, text)
    return [{f["alert"] for f in a["firing"]} for a in answers]


def test_a_healthy_cluster_fires_no_alert(tmp_path: Path) -> None:
    assert _firing(tmp_path, {}, "30m", "3h") == [set(), set()]


# One fault each: (changed series, the minute before the alert's `for:` has run, the
# minute it has), and what fires then and at 3h: that alert, and only those its fault implies. The
# minutes are exact, so a `for:` a minute longer or shorter fails; a fault's values sit
# near the threshold, and NEAR_MISSES holds the healthy side of each.
FAULTS = {
    "HeadroomWebhookCertificateExpiring": (
        {'headroom_webhook_certificate_expiry_timestamp_seconds{pod="w"}': "1123200x180"},  # 13 d
        "59m", "60m", {"HeadroomWebhookCertificateExpiring"},
    ),
    "HeadroomWebhookCertificateExpiresSoon": (
        {'headroom_webhook_certificate_expiry_timestamp_seconds{pod="w"}': "216000x180"},  # 2.5 d
        "9m", "10m", {"HeadroomWebhookCertificateExpiresSoon"},
    ),
    "HeadroomWebhookNotScraped": (
        # Its last scrape at 10m, the stale marker Prometheus writes when the target
        # goes or fails to answer at 11m: absent from then on.
        {'headroom_webhook_open_connections{pod="w"}': "2x10 stale"},
        "15m", "16m", {"HeadroomWebhookNotScraped"},
    ),
    "HeadroomWebhookNotScraped, no stale marker": (
        # Its last scrape at 10m and no marker (Prometheus itself restarted): the
        # series is gone once the 5-minute lookback has passed it, at 15m.
        {'headroom_webhook_open_connections{pod="w"}': "2x10"},
        "19m", "20m", {"HeadroomWebhookNotScraped"},
    ),
    "HeadroomWebhookInvalidPolicy": (
        {'headroom_webhook_invalid_policies{pod="w"}': "0x9 1x170"},
        "14m", "15m", {"HeadroomWebhookInvalidPolicy"},
    ),
    "HeadroomExtenderNotAnswering": (
        {'headroom_extender_answering{pod="s1"}': "1x9 0x170"},
        "14m", "15m", {"HeadroomExtenderNotAnswering"},
    ),
    "HeadroomExtenderNotAnswering, no extender scraped": (
        {
            'headroom_extender_answering{pod="s1"}': "1x10 stale",
            'headroom_extender_answering{pod="s2"}': "0x10 stale",
        },
        "15m", "16m", {"HeadroomExtenderNotAnswering"},
    ),
    "HeadroomExtenderErrors": (
        {'headroom_extender_requests_total{verb="filter",outcome="error"}': "0x9 1+1x170"},
        "19m", "20m", {"HeadroomExtenderErrors"},
    ),
    "HeadroomExtenderBindsRefused": (
        # From 30m, 24 refused a minute beside 60 bound: over the quarter (0.29) by 43m.
        {'headroom_extender_requests_total{verb="bind",outcome="refused"}': "0x29 0+24x150"},
        "57m", "58m", {"HeadroomExtenderBindsRefused"},
    ),
    "HeadroomGPUNodesUnmeasured": (
        {'headroom_extender_gpu_nodes_unmeasured{reason="stale"}': "0x9 1x170"},
        "14m", "15m", {"HeadroomGPUNodesUnmeasured"},
    ),
    "HeadroomAgentNVMLUnavailable": (
        # As the components export it: the agent marks its GPUs unread too (which
        # HeadroomAgentGPUsUnread leaves to this alert), the extender the node unmeasured.
        {
            'headroom_agent_probe_available{node="n1"}': "1x9 0x170",
            'headroom_agent_gpus_unread{node="n1"}': "0x9 1x170",
            'headroom_extender_gpu_nodes_unmeasured{reason="nvml-unavailable"}': "0x9 1x170",
        },
        "14m", "15m", {"HeadroomAgentNVMLUnavailable", "HeadroomGPUNodesUnmeasured"},
    ),
    "HeadroomAgentGPUsUnread": (
        {'headroom_agent_gpus_unread{node="n1"}': "0x9 1x170"},
        "19m", "20m", {"HeadroomAgentGPUsUnread"},
    ),
    "HeadroomGuardEvicted": (
        # One eviction a minute from 10m (one alone: the test after this table).
        {'headroom_agent_guard_actions_total{node="n1",kind="evict"}': "0x9 1+1x170"},
        "10m", "11m", {"HeadroomGuardEvicted"},
    ),
    "HeadroomGuardActionsFailing": (
        {'headroom_agent_guard_actions_total{node="n1",kind="error"}': "0x9 1+1x170"},
        "24m", "25m", {"HeadroomGuardActionsFailing"},
    ),
}  # fmt: skip


# What a fault raises too, once a slower `for:` has run: a certificate under 3 days
# is under 14 (an hour's `for:`).
LATER = {"HeadroomWebhookCertificateExpiresSoon": {"HeadroomWebhookCertificateExpiring"}}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_fires_its_alert_once_its_for_has_run(tmp_path: Path, fault: str) -> None:
    changes, before, after, fired = FAULTS[fault]
    # Still the same at 3h: a slower alert the fault should not raise has run its `for:`.
    later = fired | LATER.get(fault, set())
    assert _firing(tmp_path, changes, before, after, "3h") == [set(), fired, later]


# The healthy side of each threshold, near it: nothing more fires by 3h (what fires,
# the fault's other alerts). A threshold moved past one of these, or past its fault's
# values in FAULTS, fails.
NEAR_MISSES = {
    "certificate expiring in 15 days": (
        {'headroom_webhook_certificate_expiry_timestamp_seconds{pod="w"}': "1296000x180"},
        set(),
    ),
    "certificate expiring in 3.2 days": (
        {'headroom_webhook_certificate_expiry_timestamp_seconds{pod="w"}': "276480x180"},
        {"HeadroomWebhookCertificateExpiring"},
    ),
    "a fifth of binds refused (18 a minute beside 60 bound, 0.23)": (
        {'headroom_extender_requests_total{verb="bind",outcome="refused"}': "0x29 0+18x150"},
        set(),
    ),
    "errors on another outcome than the alert's": (
        {'headroom_extender_requests_total{verb="bind",outcome="refused"}': "0+15x180"},
        set(),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_the_healthy_side_of_each_threshold_fires_nothing_more(tmp_path: Path, case: str) -> None:
    changes, fired = NEAR_MISSES[case]
    assert _firing(tmp_path, changes, "3h") == [fired]


def test_every_alert_has_a_fault_that_fires_it() -> None:
    assert {name.split(",")[0] for name in FAULTS} == {a["alert"] for a in alerts()}


def test_the_guard_alerts_end_when_their_window_has_passed(tmp_path: Path) -> None:
    # One eviction, one failed action at 10m: "evicted in the last hour" holds while the
    # window reaches back past 10m, to 68m, and the failure's 30-minute window to 38m
    # (firing from 25m, 15 minutes of `for:` after 10m). A window a minute longer or
    # shorter fails.
    changes = {
        'headroom_agent_guard_actions_total{node="n1",kind="evict"}': "0x9 1x170",
        'headroom_agent_guard_actions_total{node="n1",kind="error"}': "0x9 1x170",
    }
    assert _firing(tmp_path, changes, "38m", "39m", "68m", "69m") == [
        {"HeadroomGuardEvicted", "HeadroomGuardActionsFailing"},
        {"HeadroomGuardEvicted"},
        {"HeadroomGuardEvicted"},
        set(),
    ]


def test_the_component_renders_onto_the_base(tmp_path: Path) -> None:
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("no kubectl to run kustomize with")
    relative = os.path.relpath(ROOT / "manifests", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{relative}/base]\n"
        f"components: [{relative}/components/monitoring, {relative}/components/networkpolicy]\n"
    )
    rendered = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = [o["kind"] for o in objects]
    assert kinds.count("PodMonitor") == 3
    assert kinds.count("PrometheusRule") == 1
    # The NetworkPolicy lets the monitoring namespace reach every port scraped.
    (scheduler,) = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "headroom-scheduler"
    ]
    allowed = {p["port"] for rule in scheduler["spec"]["ingress"] for p in rule["ports"]}
    (extender,) = [
        c
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "headroom-scheduler"
        for c in o["spec"]["template"]["spec"]["containers"]
        if c["name"] == "extender"
    ]
    assert extender["ports"][0]["containerPort"] in allowed


def _literals(*relative: str) -> set[str]:
    """Every string constant in the given modules: what a label value can be set to."""
    return {
        node.value
        for path in relative
        for node in ast.walk(ast.parse((ROOT / path).read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_every_label_value_an_alert_matches_is_one_the_code_sets() -> None:
    # verb and outcome (extender.server), kind (agent.service): a value renamed there
    # would leave an alert matching nothing, silently.
    values = _literals("extender/server.py", "agent/service.py")
    matched = 0
    for alert in alerts():
        for key, pattern in re.findall(r'\b(verb|outcome|kind)\s*=~?\s*"([^"]*)"', alert["expr"]):
            for value in pattern.split("|"):
                assert value in values, (alert["alert"], key, value)
                matched += 1
    assert matched >= 10


def test_the_readme_says_what_every_alert_means() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Monitoring") :]
    section = section[: section.index("\n### ", 1)]
    for alert in alerts():
        row = f"| `{alert['alert']}` | {alert['labels']['severity']} |"
        assert row in section, row
    for name in ("headroom_extender_answering", "headroom_extender_gpu_nodes_unmeasured"):
        assert name in section


def test_every_series_an_increase_alert_reads_is_there_at_zero_from_the_start() -> None:
    # increase() and rate() need two samples of a series: one that first appears at 1
    # (a labelled counter's child is created by its first inc()) reads as no increase,
    # so an agent's first eviction, often its only one, would never raise
    # HeadroomGuardEvicted. Each series such an alert matches must be exported at 0.
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for registry in registries()
        for family in registry.collect()
        for s in family.samples
    }
    checked = 0
    for alert in alerts():
        pattern = r'increase\(\s*([a-z_]+)\{\s*(kind|result)\s*=~?\s*"([^"]*)"\s*\}'
        for metric, key, values in re.findall(pattern, alert["expr"]):
            for value in values.split("|"):
                assert samples.get((metric, ((key, value),))) == 0.0, (alert["alert"], value)
                checked += 1
    assert checked >= 3
    # The extender's errors, by rate(): every verb's error outcomes, and all of them.
    errors = {"error", "internal-error", "bad-request", "not-json", "too-large"}
    (expr,) = [a["expr"] for a in alerts() if a["alert"] == "HeadroomExtenderErrors"]
    (matched,) = re.findall(r'outcome=~"([^"]*)"', expr)
    assert set(matched.split("|")) == errors
    for verb, outcomes in OUTCOMES.items():
        for outcome in errors & set(outcomes):
            key = ("headroom_extender_requests_total", (("outcome", outcome), ("verb", verb)))
            assert samples.get(key) == 0.0, key
