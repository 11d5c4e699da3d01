"""``headroom webhook``: serve the mutating admission webhook over HTTPS.

Reads the serving certificate from --cert-dir (tls.crt, tls.key, as a
kubernetes.io/tls Secret mounts them) and reloads it when the files change.
Watches namespaces, GPUSharingPolicies and MIG-capable nodes; /readyz answers
503 until those caches have synced.
"""

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from cli.options import add_kubeconfig, duration, port
from headroom import names

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "webhook",
        help="serve the mutating admission webhook "
        "(HTTPS: /mutate /validate-eviction /healthz /readyz /metrics)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cert-dir",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory with tls.crt and tls.key (see: headroom certs generate)",
    )
    parser.add_argument("--port", type=port, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    add_kubeconfig(parser)
    parser.add_argument(
        "--no-node-watch",
        dest="watch_nodes",
        action="store_false",
        help="do not watch MIG-capable nodes; MIG choices then use the built-in profile table "
        "(and the webhook needs no access to nodes)",
    )
    parser.add_argument(
        "--cert-check-interval",
        type=duration,
        default=10.0,
        metavar="DURATION",
        help="how often to look for a rotated certificate, e.g. 10s, 500ms (default 10s)",
    )
    parser.add_argument(
        "--service",
        default="headroom-webhook",
        help="the webhook's Service; the certificate must name <service>.<namespace>.svc, "
        "or a new one is not loaded and /readyz fails (default headroom-webhook)",
    )
    parser.add_argument(
        "--service-namespace",
        default="headroom-system",
        metavar="NS",
        help="the Service's namespace (default headroom-system)",
    )
    parser.add_argument(
        "--agent-user",
        default=names.AGENT_USER,
        help="the node agent's ServiceAccount user: its pod evictions are allowed only on "
        f"the node its token is bound to (POST /validate-eviction; default {names.AGENT_USER})",
    )
    add_limits(parser)
    parser.add_argument(
        "--expected-dns",
        action="append",
        default=[],
        metavar="NAME",
        help="another DNS name the certificate must carry (repeatable)",
    )
    parser.set_defaults(run=run)


def count(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return number


def add_limits(parser: argparse.ArgumentParser) -> None:
    from webhook.limits import Limits

    default = Limits()
    group = parser.add_argument_group(
        "limits", "what one client may hold, and for how long (README: The webhook under load)"
    )
    group.add_argument(
        "--max-connections",
        type=count,
        default=default.max_connections,
        metavar="N",
        help="open connections; new ones beyond are closed at once "
        f"(default {default.max_connections})",
    )
    group.add_argument(
        "--max-in-flight",
        type=count,
        default=default.max_in_flight,
        metavar="N",
        help="admission requests answered at once; beyond, the pod is denied with "
        f'"headroom webhook busy, retry" (default {default.max_in_flight})',
    )
    group.add_argument(
        "--keepalive-timeout",
        type=duration,
        default=default.keepalive_timeout,
        metavar="DURATION",
        help=f"close a connection idle this long (default {default.keepalive_timeout:g}s)",
    )
    group.add_argument(
        "--header-timeout",
        type=duration,
        default=default.header_timeout,
        metavar="DURATION",
        help="time for a request's headers, from its first byte or the TLS handshake "
        f"(default {default.header_timeout:g}s)",
    )
    group.add_argument(
        "--body-timeout",
        type=duration,
        default=default.body_timeout,
        metavar="DURATION",
        help=f"time for a request's body after its headers (default {default.body_timeout:g}s)",
    )


def run(args: argparse.Namespace) -> int:
    from kube.config import KubeConfigError
    from webhook.limits import Limits
    from webhook.service import Settings, serve
    from webhook.tls import CertificateError

    settings = Settings(
        cert_dir=args.cert_dir,
        host=args.host,
        port=args.port,
        kubeconfig=args.kubeconfig,
        watch_nodes=args.watch_nodes,
        limits=Limits(
            max_connections=args.max_connections,
            max_in_flight=args.max_in_flight,
            keepalive_timeout=args.keepalive_timeout,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
        ),
        cert_check_seconds=max(args.cert_check_interval, 0.1),
        expected_dns=(f"{args.service}.{args.service_namespace}.svc", *args.expected_dns),
        agent_user=args.agent_user,
    )
    try:
        asyncio.run(serve(settings))
    except CertificateError as err:
        log.error("--cert-dir %s: %s (see: headroom certs generate)", args.cert_dir, err)
        return 2
    except KubeConfigError as err:
        log.error("%s", err)
        return 2
    except OSError as err:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, err)
        return 1
    return 0
