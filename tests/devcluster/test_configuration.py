"""What devcluster writes for the control plane, checked without running it."""

import base64
import re
from pathlib import Path

from devcluster import binaries, components, controlplane, nodes


def test_binary_versions_match_the_pinned_go_modules() -> None:
    here = binaries.BUILD_SCRIPT.parent
    k8s = (here / "k8s" / "go.mod").read_text()
    kwok = (here / "kwok" / "go.mod").read_text()

    assert re.search(rf"^\s*k8s\.io/kubernetes {binaries.KUBERNETES_VERSION}$", k8s, re.M)
    assert re.search(rf"sigs\.k8s\.io/kwok {binaries.KWOK_VERSION}$", kwok, re.M)
    assert binaries.bin_dir().name == "bin"
    assert f"k8s-{binaries.KUBERNETES_VERSION}-kwok-{binaries.KWOK_VERSION}" in str(
        binaries.bin_dir()
    )


def test_headroom_scheduler_configuration_names_the_extender() -> None:
    specs = nodes.load()
    extender = components.extender_configuration(18888, specs)

    assert extender["urlPrefix"] == "http://127.0.0.1:18888"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert [r["name"] for r in extender["managedResources"]] == [
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
    ]


def test_two_schedulers_use_distinct_leases(tmp_path: Path) -> None:
    config = tmp_path / "k"
    default = controlplane.scheduler_configuration(
        config, scheduler_name="default-scheduler", lease=("kube-system", "kube-scheduler")
    )
    headroom = controlplane.scheduler_configuration(
        config,
        scheduler_name="headroom-scheduler",
        lease=("headroom-system", "headroom-scheduler"),
        extender={"urlPrefix": "http://127.0.0.1:1"},
    )

    assert default["leaderElection"]["resourceName"] != headroom["leaderElection"]["resourceName"]
    assert "extenders" not in default
    assert headroom["profiles"] == [{"schedulerName": "headroom-scheduler"}]


def test_register_webhook_fills_url_and_ca_bundle() -> None:
    configuration = {
        "kind": "MutatingWebhookConfiguration",
        "webhooks": [
            {"name": "pods.headroom.dev", "clientConfig": {"url": "x", "caBundle": "Cg=="}}
        ],
    }

    (registered,) = components.register_webhook([configuration], port=9443, ca_bundle=b"PEM")

    client = registered["webhooks"][0]["clientConfig"]
    assert client == {
        "url": "https://127.0.0.1:9443/mutate",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
