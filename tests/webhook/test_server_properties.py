"""Property: whatever arrives on /mutate -- bytes, JSON, reviews with random
fields, real fixtures with one field replaced by junk -- the real app answers
with a 200/400/413, never a 500; and every patch it returns applies cleanly
to the object it was computed for (the apiserver would accept it)."""

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webhook.conftest import Client
from tests.webhook.reviews import patched, review_json

FIXTURES = [
    "deployment-pod-shared",
    "deployment-pod-mig",
    "pod-multi-container",
    "pod-mps-hostipc",
    "pod-cuda-vectoradd",
]

# The client fixture is one server for all examples: it holds no per-request state.
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["1", "2", "10Gi", "10Gx", "nvidia.com/gpu", "CREATE", "Pod", "pods", "v1"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


async def check(client: Client, body: bytes) -> None:
    reply = await client.post("/mutate", data=body)
    assert reply.status in (200, 400, 413), await reply.text()
    answer = await reply.json()
    if reply.status != 200:
        assert answer["kind"] == "Status"
        assert answer["message"]
        return
    response = answer["response"]
    sent = json.loads(body)
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    assert ("patch" in response) == ("patchType" in response)
    if not response["allowed"]:
        assert response["status"]["message"]
    if "patch" in response:
        patched(copy.deepcopy(sent["request"]["object"]), response)  # raises if it does not apply


@SETTINGS
@given(body=st.binary(max_size=512))
async def test_random_bytes_never_give_a_500(client: Client, body: bytes) -> None:
    reply = await client.post("/mutate", data=body)
    assert reply.status in (200, 400), await reply.text()


@SETTINGS
@given(document=json_values)
async def test_random_json_never_gives_a_500(client: Client, document: Any) -> None:
    await check(client, json.dumps(document).encode())


@SETTINGS
@given(
    request=st.fixed_dictionaries(
        {"uid": st.text(min_size=1, max_size=40)},
        optional={
            "kind": st.just({"group": "", "version": "v1", "kind": "Pod"}) | json_values,
            "resource": st.just({"group": "", "version": "v1", "resource": "pods"}) | json_values,
            "namespace": st.sampled_from(["ml-team", "mig-team", "default", ""]) | json_values,
            "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]) | json_values,
            "object": json_values,
            "dryRun": st.booleans() | json_values,
        },
    )
)
async def test_reviews_with_random_fields_never_give_a_500(
    client: Client, request: dict[str, Any]
) -> None:
    document = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    await check(client, json.dumps(document).encode())


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def damaged_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A real fixture whose pod has one value (anywhere) replaced by random JSON."""
    document = review_json(draw(st.sampled_from(FIXTURES)))
    pod = document["request"]["object"]
    path = draw(st.sampled_from(_paths(pod)[1:]))
    parent = pod
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = draw(json_values)
    return document


@SETTINGS
@given(document=damaged_pods())
async def test_real_pods_with_a_damaged_field_never_give_a_500_nor_a_bad_patch(
    client: Client, document: dict[str, Any]
) -> None:
    await check(client, json.dumps(document).encode())
