"""Headroom's decision core: pure functions over plain data, no I/O.

The shells (``webhook``, ``extender``, ``agent``) parse the wire, call into
this package, and serialise the answer. Nothing here imports aiohttp,
kubernetes, pynvml or prometheus_client (enforced by import-linter).
"""

__version__ = "0.1.0"
