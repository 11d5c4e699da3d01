"""A stand-in for the apiserver's ``GET pod``, shared by the tests of kube.rest's users."""

from aiohttp import web

POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"


async def read_pod(request: web.Request) -> web.Response:
    """``gone``: 404; ``broken``: 503 "etcd down"; any other name: bound to ``gpu-a``."""
    name = request.match_info["name"]
    if name == "gone":
        return web.json_response({"kind": "Status", "code": 404}, status=404)
    if name == "broken":
        return web.json_response({"kind": "Status", "message": "etcd down"}, status=503)
    return web.json_response({"metadata": {"name": name}, "spec": {"nodeName": "gpu-a"}})
