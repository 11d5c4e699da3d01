"""The GPUNodeReport CRD and headroom/reports.py agree, both ways.

Without ``x-kubernetes-preserve-unknown-fields`` the apiserver prunes every
field the schema does not declare, silently; so every field the model writes
must be in the schema, with a type the schema accepts. The other way, the
schema's required fields and enums must be the model's.
"""

import re
import typing
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from headroom import names
from headroom.quantity import GIB, MIB
from headroom.reports import (
    SCHEMA_VERSION,
    Condition,
    GPUUsage,
    MigDeviceUsage,
    PodUsage,
    ReportStatus,
    parse_report,
    report_object,
)

CRD_PATH = Path(__file__).parents[2] / "manifests/base/crds/gpunodereports.yaml"


def crd() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return document


def root_schema() -> dict[str, Any]:
    (version,) = crd()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def problems(schema: dict[str, Any], value: Any, where: str = "") -> list[str]:
    """A structural check of ``value`` against a CRD schema, as the apiserver
    validates and prunes (the subset of OpenAPI v3 this CRD uses)."""
    kind = schema.get("type")
    found: list[str] = []
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        properties = schema.get("properties")
        for key in schema.get("required", []):
            if key not in value:
                found.append(f"{where}.{key}: required")
        if properties is not None:
            for key, item in value.items():
                if key not in properties:
                    found.append(f"{where}.{key}: not in the schema (would be pruned)")
                else:
                    found += problems(properties[key], item, f"{where}.{key}")
    elif kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected an array"]
        if len(value) > schema.get("maxItems", len(value)):
            found.append(f"{where}: more than maxItems")
        for index, item in enumerate(value):
            found += problems(schema["items"], item, f"{where}[{index}]")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{where}: expected an integer"]
        if value < schema.get("minimum", value):
            found.append(f"{where}: below minimum")
        if schema.get("format") == "int64" and not -(2**63) <= value < 2**63:
            found.append(f"{where}: not an int64")
    elif kind == "string":
        if not isinstance(value, str):
            return [f"{where}: expected a string"]
        if len(value) > schema.get("maxLength", len(value)):
            found.append(f"{where}: longer than maxLength")
        if "enum" in schema and value not in schema["enum"]:
            found.append(f"{where}: {value!r} not in {schema['enum']}")
        if schema.get("format") == "date-time":
            datetime.fromisoformat(value)
    elif kind == "boolean":
        if not isinstance(value, bool):
            found.append(f"{where}: expected a boolean")
    else:
        found.append(f"{where}: schema without a type")
    return found


def rich_report() -> ReportStatus:
    pod = PodUsage(
        uid="7d0c2a4e-9b1f-4c3d-8e5a-6f7b8c9d0e1f",
        namespace="ml",
        name="notebook-0",
        containers=["jupyter"],
        used_bytes=30 * GIB,
        starved_bytes=2 * GIB,
        allocated=True,
        replicas=2,
    )
    return ReportStatus(
        node_name="gpu-node-1",
        backend="simulated",
        observed_at=datetime(2025, 1, 1, 12, 0, 5, 123456, tzinfo=UTC),
        heartbeat_seconds=30,
        gpus=[
            GPUUsage(
                index=0,
                uuid="GPU-5f2b9c3e-8d1a-4e7f-b6c2-9a0d1e2f3a4b",
                product="NVIDIA-A100-PCIE-40GB",
                total_bytes=40960 * MIB,
                used_bytes=40 * GIB,
                free_bytes=0,
                pods=[pod],
                unattributed_bytes=512 * MIB,
            ),
            GPUUsage(
                index=1,
                uuid="GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
                product="NVIDIA-A100-SXM4-40GB",
                total_bytes=40960 * MIB,
                used_bytes=5 * GIB,
                free_bytes=35 * GIB,
                mig_enabled=True,
                mig_devices=[
                    MigDeviceUsage(
                        uuid="MIG-11111111-2222-3333-4444-555555555555",
                        profile="3g.20gb",
                        total_bytes=19968 * MIB,
                        used_bytes=5 * GIB,
                        pods=[replace(pod, starved_bytes=None)],
                    )
                ],
            ),
        ],
        conditions=[
            Condition(
                type="NVMLAvailable",
                status="True",
                reason="Simulated",
                message="GPUs are simulated",
                last_transition_time=datetime(2025, 1, 1, tzinfo=UTC),
            )
        ],
    )


@pytest.mark.parametrize(
    "status",
    [
        rich_report(),
        ReportStatus(node_name="n", backend="nvml", observed_at=datetime(2025, 1, 1, tzinfo=UTC)),
    ],
    ids=["rich", "minimal"],
)
def test_every_field_the_agent_writes_is_declared_and_valid(status: ReportStatus) -> None:
    obj = report_object(status)
    assert obj["apiVersion"] == names.API_VERSION
    assert obj["kind"] == names.REPORT_KIND
    assert problems(root_schema(), obj) == []
    assert parse_report(obj) == status  # and it reads back as written


def test_a_report_from_before_allocated_reads_as_not_allocated() -> None:
    """``allocated`` came without a schemaVersion bump: an older agent's pods are
    read as they were meant, listed for the memory they hold."""
    obj: Any = report_object(rich_report())
    assert obj["status"]["gpus"][0]["pods"][0]["allocated"] is True
    del obj["status"]["gpus"][0]["pods"][0]["allocated"]
    status = parse_report(obj)
    assert status.schema_version == SCHEMA_VERSION
    assert not status.gpus[0].pods[0].allocated


def test_a_report_from_before_replicas_reads_as_not_counted() -> None:
    """``replicas`` came without a schemaVersion bump: an older agent's allocations
    are read as uncounted, which locates no pod of several replicas (as before)."""
    obj: Any = report_object(rich_report())
    assert obj["status"]["gpus"][0]["pods"][0]["replicas"] == 2
    del obj["status"]["gpus"][0]["pods"][0]["replicas"]
    status = parse_report(obj)
    assert status.schema_version == SCHEMA_VERSION
    assert status.gpus[0].pods[0].replicas is None
    written: Any = report_object(status)
    assert "replicas" not in written["status"]["gpus"][0]["pods"][0]


def test_the_checker_catches_what_the_apiserver_would_prune_or_refuse() -> None:
    obj: Any = report_object(rich_report())
    obj["status"]["gpus"][0]["temperature"] = 71
    obj["status"]["backend"] = "dcgm"
    obj["status"]["gpus"][0]["pods"][0]["usedBytes"] = -1
    del obj["status"]["observedAt"]
    found = problems(root_schema(), obj)
    assert ".status.gpus[0].temperature: not in the schema (would be pruned)" in found
    assert ".status.backend: 'dcgm' not in ['nvml', 'simulated']" in found
    assert ".status.gpus[0].pods[0].usedBytes: below minimum" in found
    assert ".status.observedAt: required" in found


def model_properties(model: type[Any]) -> dict[str, tuple[bool, Any]]:
    """Wire name -> (required, annotation), computed fields included (the report models
    are pydantic dataclasses: their fields are ``__pydantic_fields__``)."""
    fields: dict[str, tuple[bool, Any]] = {}
    for name, info in model.__pydantic_fields__.items():
        alias = info.alias or name
        fields[alias] = (info.is_required(), info.annotation)
    for name, computed in model.__pydantic_decorators__.computed_fields.items():
        fields[computed.info.alias or name] = (False, computed.info.return_type)
    return fields


def status_schema() -> dict[str, Any]:
    schema: dict[str, Any] = root_schema()["properties"]["status"]
    return schema


def gpu_schema() -> dict[str, Any]:
    schema: dict[str, Any] = status_schema()["properties"]["gpus"]["items"]
    return schema


@pytest.mark.parametrize(
    ("model", "schema"),
    [
        (ReportStatus, status_schema),
        (GPUUsage, gpu_schema),
        (MigDeviceUsage, lambda: gpu_schema()["properties"]["migDevices"]["items"]),
        (PodUsage, lambda: gpu_schema()["properties"]["pods"]["items"]),
        (
            PodUsage,
            lambda: gpu_schema()["properties"]["migDevices"]["items"]["properties"]["pods"][
                "items"
            ],
        ),
        (Condition, lambda: status_schema()["properties"]["conditions"]["items"]),
    ],
)
def test_schema_and_model_have_the_same_fields_requirements_and_enums(
    model: type[Any], schema: Any
) -> None:
    node = schema()
    fields = model_properties(model)
    assert set(node["properties"]) == set(fields)
    assert set(node.get("required", [])) == {
        key for key, (required, _) in fields.items() if required
    }
    for key, (_, annotation) in fields.items():
        if typing.get_origin(annotation) is typing.Literal:
            assert node["properties"][key]["enum"] == list(typing.get_args(annotation)), key


def test_printer_columns_point_at_declared_fields() -> None:
    (version,) = crd()["spec"]["versions"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if path.startswith(".metadata"):
            continue
        node = root_schema()
        # `.status.conditions[?(@.type=="X")].status` -> status, conditions[], status
        for part in re.sub(r"\[[^\]]*\]", "[]", path).lstrip(".").split("."):
            key = part.split("[", 1)[0]
            node = node["properties"][key]
            if "[" in part:
                node = node["items"]
        assert node["type"] in ("string", "integer", "boolean", "object", "array"), path


def test_names_match_the_constants() -> None:
    spec = crd()["spec"]
    assert spec["group"] == names.GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"]["plural"] == names.REPORT_PLURAL
    assert spec["names"]["kind"] == names.REPORT_KIND
    (version,) = spec["versions"]
    assert f"{spec['group']}/{version['name']}" == names.API_VERSION
    assert "subresources" not in version  # the agent writes .status with the object
