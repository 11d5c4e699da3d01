"""`headroom top`'s table, from the extender's own state and accounting."""

from cli.main import build_parser
from cli.top import COLUMNS, PODS_WIDTH, pods_cell, render
from extender.state import ClusterState
from tests.extender.objects import EPOCH, GIB, gpu_node, gpu_pod, gpu_report, uid_of


def test_table_per_node_and_gpu() -> None:
    state = ClusterState(margin=GIB // 2, stale_after=90.0, clock=EPOCH.timestamp)
    state.on_node("ADDED", gpu_node("gpu-a", gpus=2))
    state.on_node("ADDED", gpu_node("gpu-b"))
    state.on_node("ADDED", gpu_node("mig-a", replicas=1, mig={"1g.5gb": 7}))
    sim = gpu_pod("simulation", node="gpu-a", declared="10Gi")
    state.on_pod("ADDED", sim)
    state.on_pod("ADDED", gpu_pod("slice", node="mig-a", mig="1g.5gb", declared="4Gi"))
    state.on_report("ADDED", gpu_report("gpu-a", {0: {uid_of(sim): 12 * GIB}, 1: {}}))
    accounts = [state.account(n) for n in sorted(state.nodes)]
    table = render(a for a in accounts if a is not None)
    lines = table.splitlines()
    assert lines[0].split() == list(COLUMNS)
    gpu0 = lines[1].split()
    assert gpu0[:3] == ["gpu-a", "0", "NVIDIA-A100-PCIE-40GB"]
    assert " ".join(gpu0[3:11]) == "40.0 GiB 10.0 GiB 12.0 GiB 27.5 GiB"
    assert gpu0[11:] == ["report", "1:", "simulation"]
    assert lines[2].split()[-2:] == ["report", "-"]  # gpu 1: the pod was seen on gpu 0
    assert any(line.startswith("gpu-b") and "declarations" in line for line in lines)
    assert any("mig 1g.5gb" in line and "6/7 free" in line for line in lines)
    assert "gpu-b: no GPUNodeReport from the node agent" in table


def test_parser_defaults() -> None:
    args = build_parser().parse_args(["top"])
    assert args.margin == 512 * 2**20
    assert args.report_stale_after == 90.0
    args = build_parser().parse_args(["extender", "--margin", "1Gi", "--report-stale-after", "45s"])
    assert (args.port, args.host, args.margin, args.report_stale_after) == (
        8888,
        "127.0.0.1",
        GIB,
        45.0,
    )


def test_many_pods_are_counted_not_listed_past_the_width() -> None:
    names = [f"tensorflow-gpu-7c775d5d6d-{i:05d}" for i in range(12)]
    cell = pods_cell(names)
    assert cell.startswith("12: tensorflow-gpu-7c775d5d6d-00000")
    assert cell.endswith("(+11 more)")
    assert len(cell) < PODS_WIDTH + 20
    assert pods_cell(["a", "b"]) == "2: a, b"
    assert pods_cell([]) == "-"


def test_a_legacy_pod_is_named_as_such() -> None:
    # A 0.1 pod (gpu.shared, no headroom.dev/gpu-memory) is charged the whole GPU;
    # the table says why, so an operator knows to recreate it.
    state = ClusterState(margin=GIB // 2, stale_after=90.0, clock=EPOCH.timestamp)
    state.on_node("ADDED", gpu_node("gpu-a"))
    state.on_pod("ADDED", gpu_pod("old", node="gpu-a", declared=None))
    state.on_pod("ADDED", gpu_pod("new", node="gpu-a", declared="4Gi"))
    account = state.account("gpu-a")
    assert account is not None
    row = render([account]).splitlines()[1]
    assert "old (legacy)" in row, row
    assert "new (legacy)" not in row, row
