"""The shipped KubeSchedulerConfiguration's extender entry (manifests/base/scheduler).

kube-scheduler calls the extender only for pods asking one of its
``managedResources``, matched by exact name, and refuses to start on a name
listed twice (``duplicate extender managed resource name``, pkg/scheduler/apis/
config/validation): a MIG profile missing here is placed without the extender.
"""

import re
from pathlib import Path

import yaml

from headroom import names
from headroom.mig import KNOWN_PROFILES, parse_profile_name, profile_from_resource

CONFIGMAP = Path(__file__).resolve().parents[2] / "manifests/base/scheduler/configmap.yaml"


def managed() -> list[str]:
    configmap = yaml.safe_load(CONFIGMAP.read_text())
    configuration = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
    (extender,) = configuration["extenders"]
    return [resource["name"] for resource in extender["managedResources"]]


def test_no_name_is_listed_twice() -> None:
    listed = managed()
    assert len(listed) == len(set(listed)), sorted(n for n in listed if listed.count(n) > 1)


def test_shared_replicas_and_only_mig_profiles_are_listed() -> None:
    shared, *mig = managed()
    assert shared == names.GPU_SHARED
    for name in mig:
        profile = profile_from_resource(name)
        assert profile is not None, name
        parse_profile_name(profile)  # raises on anything not NVIDIA's spelling


def test_every_profile_headroom_knows_is_listed_with_its_media_variant_for_1g() -> None:
    listed = {profile_from_resource(name) for name in managed()}
    assert set(KNOWN_PROFILES) <= listed
    # Profiles of the GPUs the built-in table does not size (their nodes' GFD labels do).
    assert {"1g.12gb", "3g.47gb", "1g.18gb", "3g.71gb", "7g.141gb", "1g.23gb", "7g.180gb"} <= listed
    for profile in ("1g.5gb", "1g.10gb", "1g.6gb", "1g.12gb", "1g.18gb", "1g.23gb"):
        assert f"{profile}+me" in listed


def test_the_readme_counts_the_profiles_listed() -> None:
    readme = (CONFIGMAP.parents[3] / "README.md").read_text()
    match = re.search(r"`manifests/base` lists the (\d+) profiles", readme)
    assert match is not None
    assert int(match[1]) == len(managed()) - 1  # all but nvidia.com/gpu.shared
