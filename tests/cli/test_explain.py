"""``headroom explain``: the webhook's decision, offline, for people and scripts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PODS = ROOT / "tests/data/pods"
POLICIES = ROOT / "manifests/base/policies"
SHARED = str(POLICIES / "gpu-shared.yaml")


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["explain", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_is_one_object_with_the_mutated_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(
        capsys, "-f", str(PODS / "tensorflow-deployment.yaml"), "--policy", SHARED, "-o", "json"
    )
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"allowed", "message", "warnings", "patch", "pod"}
    assert result["allowed"] is True
    assert result["pod"]["metadata"]["generateName"] == "tensorflow-gpu-"
    limits = result["pod"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu.shared": "1", "headroom.dev/gpu-memory": "4Gi"}
    assert any(op["path"].endswith("nvidia.com~1gpu.shared") for op in result["patch"])


def test_text_output_reads_like_a_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(
        capsys,
        "-f",
        str(PODS / "dcgmproftester-deployment.yaml"),
        "--namespace",
        "ml",
        "--namespace-labels",
        "headroom.dev/policy=gpu-shared,team=a",
        "--policy",
        SHARED,
    )
    assert code == 0
    assert "Pod:       pod template of Deployment nvidia-plugin-test, namespace ml" in out
    assert "Decision:  allowed (mutated)" in out
    assert (
        'headroom: container "dcgmproftester12": nvidia.com/gpu: 1 -> nvidia.com/gpu.shared: 1'
        in out
    )
    assert "remove   /spec/containers/0/resources/limits/nvidia.com~1gpu" in out
    mutated = yaml.safe_load(out.split("Mutated pod:\n---\n", 1)[1])
    assert mutated["metadata"]["annotations"]["headroom.dev/declared-memory"] == "4Gi"


def test_denied_pods_exit_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(
        capsys,
        "-f",
        str(PODS / "dcgmproftester-2gpu-deployment.yaml"),
        "--policy",
        str(POLICIES / "gpu-mps.yaml"),
        "-o",
        "json",
    )
    assert code == 1
    result = json.loads(out)
    assert result["allowed"] is False
    assert "multiGPU: deny" in result["message"]
    assert result["patch"] == []


def test_several_policy_files_and_the_namespace_label_picks_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["-f", str(PODS / "mps-pod.yaml"), "-o", "json"]
    for path in sorted(POLICIES.glob("*.yaml")):
        args += ["--policy", str(path)]
    code, out, _ = explain(capsys, *args, "--namespace-labels", "headroom.dev/policy=gpu-mig")
    assert code == 0
    limits = json.loads(out)["pod"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.5gb": "1"}


def test_without_a_policy_label_and_several_policies_nothing_happens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    both = ["--policy", SHARED, "--policy", str(POLICIES / "gpu-mig.yaml")]
    code, out, _ = explain(capsys, "-f", str(PODS / "cuda-vectoradd.yaml"), *both)
    assert code == 0
    assert "No patch" in out
    assert "namespace has no headroom.dev/policy label" in out


def test_namespace_labels_without_a_policy_label_explain_an_unlabelled_namespace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Labels given but none of them headroom.dev/policy: the webhook would
    # leave the pod alone, so explain must not slip the one policy in.
    pod = str(PODS / "cuda-vectoradd.yaml")
    code, out, _ = explain(capsys, "-f", pod, "--namespace-labels", "team=a", "--policy", SHARED)
    assert code == 0
    assert "No patch" in out
    assert "namespace has no headroom.dev/policy label" in out


def test_without_namespace_labels_one_policy_is_the_namespace_s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = explain(capsys, "-f", str(PODS / "cuda-vectoradd.yaml"), "--policy", SHARED)
    assert code == 0
    assert "nvidia.com/gpu.shared" in out


def test_nodes_file_gives_the_mig_offer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "kind: NodeList\napiVersion: v1\nitems:\n"
        "- metadata: {name: a100}\n  status: {capacity: {nvidia.com/mig-3g.20gb: '2'}}\n"
    )
    code, out, _ = explain(
        capsys,
        "-f",
        str(PODS / "cuda-vectoradd.yaml"),
        "--policy",
        str(POLICIES / "gpu-mig.yaml"),
        "--nodes",
        str(nodes),
        "-o",
        "json",
    )
    assert code == 0
    result = json.loads(out)
    assert result["pod"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-3g.20gb": "1"
    }
    assert any("using larger 3g.20gb" in w for w in result["warnings"])


def test_a_pod_from_kubectl_get_keeps_its_timestamps_as_strings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # kubectl get -o yaml writes unquoted timestamps; JSON output must still work.
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n"
        "  creationTimestamp: 2024-05-01T10:00:00Z\nspec:\n  containers:\n"
        "  - {name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}\n"
    )
    code, out, _ = explain(capsys, "-f", str(pod), "--policy", SHARED, "-o", "json")
    assert code == 0
    result = json.loads(out)
    assert result["pod"]["metadata"]["creationTimestamp"] == "2024-05-01T10:00:00Z"
    assert result["pod"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu.shared": "1",
        "headroom.dev/gpu-memory": "4Gi",
    }


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "no such file"),
        ("kind: Service\nmetadata: {name: s}\n", "kind 'Service' has no pod to explain"),
        ("kind: Pod\nspec: [", "not valid YAML"),
        ("kind: Deployment\nmetadata: {name: d}\nspec: {}\n", "no pod template at .spec.template"),
        ("", "expected one Kubernetes object, found 0"),
    ],
)
def test_unusable_input_exits_2_and_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, manifest: str | None, message: str
) -> None:
    path = tmp_path / "in.yaml"
    if manifest is not None:
        path.write_text(manifest)
    code, out, err = explain(capsys, "-f", str(path), "--policy", SHARED)
    assert code == 2
    assert out == ""
    assert message in err


def test_a_bad_policy_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: headroom.dev/v1alpha1\nkind: GPUSharingPolicy\n"
        "metadata: {name: p}\nspec: {mode: x}\n"
    )
    code, _, err = explain(capsys, "-f", str(PODS / "mps-pod.yaml"), "--policy", str(policy))
    assert code == 2
    assert "spec.mode" in err


def test_bad_namespace_labels_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = explain(
        capsys,
        "-f",
        str(PODS / "mps-pod.yaml"),
        "--policy",
        SHARED,
        "--namespace-labels",
        "novalue",
    )
    assert code == 2
    assert "'novalue' is not KEY=VALUE" in err


def test_the_installed_console_script() -> None:
    script = Path(sys.executable).parent / "headroom"
    done = subprocess.run(
        [
            str(script),
            "explain",
            "-f",
            str(PODS / "mig-3g20gb-pod.yaml"),
            "--policy",
            SHARED,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["pod"]["metadata"]["annotations"]["headroom.dev/mode"] == "mig"


def only_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_file_whose_yaml_is_broken_is_named_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Before: yaml's own multi-line excerpt, 'in "<unicode string>"', and for a policy
    # or nodes file no file name at all ("not valid YAML", "nodes: not valid YAML").
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Pod\nspec: [\n")
    deployment = str(PODS / "tensorflow-deployment.yaml")
    for args in (
        ["-f", str(broken), "--policy", SHARED],
        ["-f", deployment, "--policy", str(broken)],
        ["-f", deployment, "--policy", SHARED, "--nodes", str(broken)],
    ):
        code, _, err = explain(capsys, *args)
        assert code == 2
        line = only_line(err)
        assert str(broken) in line, line
        assert "line 3" in line, line


def test_what_is_not_an_object_a_policy_or_a_node_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    deployment = str(PODS / "tensorflow-deployment.yaml")
    text = tmp_path / "certificate.pem"
    text.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    code, _, err = explain(capsys, "-f", str(text), "--policy", SHARED)
    # Before: "expected one Kubernetes object, found 1".
    assert code == 2
    assert only_line(err) == f"headroom explain: {text}: expected a Kubernetes object, found a str"

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    # Before: exit 0, explaining an unlabelled namespace nobody asked about.
    code, _, err = explain(capsys, "-f", deployment, "--policy", str(empty))
    assert code == 2
    assert only_line(err) == f"headroom explain: {empty}: no GPUSharingPolicy in it"

    # Before: exit 0, the Deployment read as a node that offers no MIG slice.
    code, _, err = explain(capsys, "-f", deployment, "--policy", SHARED, "--nodes", deployment)
    assert code == 2
    assert (
        only_line(err) == f"headroom explain: {deployment}: document 1 is a Deployment, not a Node"
    )
