"""``headroom certs``: the webhook's CA and serving certificate, and its caBundle.

  headroom certs generate --service NAME --namespace NS [--ip IP] [--dns NAME] --out DIR
  headroom certs inject --webhook NAME --ca DIR/ca.crt [--kubeconfig PATH]
  headroom certs secret --namespace NS --service NAME [--secret headroom-webhook-tls]
      [--ca-secret headroom-webhook-ca] [--webhook NAME] [--renew-before 30d]
      [--dns NAME] [--ip IP] [--kubeconfig PATH]

``generate`` reuses the CA already in DIR (so rotating the serving certificate
needs no new caBundle) unless --new-ca is given.

``secret`` is what the in-cluster Job and CronJob run: the CA lives in its own
Secret, created once and reused; the serving Secret (kubernetes.io/tls) is
(re)issued only when missing, expiring within --renew-before, not signed by the
CA, or naming other SANs; otherwise nothing is written. With --webhook the
caBundle is set too, which changes only with the CA. Exit 0 when in line
(written or not), 1 on an API error, 2 on a malformed Secret or bad argument.
"""

import argparse
import datetime
import logging
import re
import sys
from pathlib import Path
from typing import Any

from cli.options import add_kubeconfig, one_line, quiet_retries

log = logging.getLogger(__name__)

_WINDOW = re.compile(r"^(?P<number>[0-9]+)(?P<unit>d|h|m)$")
_WINDOW_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def renewal_window(text: str) -> datetime.timedelta:
    """``30d``, ``720h`` or ``90m``: how long before expiry to re-issue."""
    match = _WINDOW.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (expected e.g. 30d, 720h)")
    return datetime.timedelta(**{_WINDOW_UNITS[match["unit"]]: int(match["number"])})


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="generate the webhook's certificates, inject its caBundle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    generate = actions.add_parser("generate", help="write ca.crt, ca.key, tls.crt, tls.key")
    generate.add_argument("--service", required=True, help="the webhook's Service name")
    generate.add_argument("--namespace", required=True, help="the Service's namespace")
    generate.add_argument(
        "--ip", action="append", default=[], help="extra IP SAN (repeatable), e.g. 127.0.0.1"
    )
    generate.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    generate.add_argument("--out", required=True, type=Path, metavar="DIR", help="output dir")
    generate.add_argument(
        "--new-ca", action="store_true", help="issue a new CA even if DIR already has one"
    )

    inject = actions.add_parser(
        "inject", help="set caBundle on every webhook of a MutatingWebhookConfiguration"
    )
    inject.add_argument("--webhook", required=True, help="MutatingWebhookConfiguration name")
    inject.add_argument("--ca", required=True, type=Path, metavar="FILE", help="CA PEM file")
    add_kubeconfig(inject)

    secret = actions.add_parser(
        "secret", help="keep the CA and serving-cert Secrets (and caBundle) issued and fresh"
    )
    secret.add_argument("--namespace", required=True, help="the Service's (and Secrets') namespace")
    secret.add_argument("--service", required=True, help="the webhook's Service name")
    secret.add_argument(
        "--secret",
        default="headroom-webhook-tls",
        help="serving Secret (kubernetes.io/tls; default headroom-webhook-tls)",
    )
    secret.add_argument(
        "--ca-secret",
        default="headroom-webhook-ca",
        help="CA Secret (ca.crt, ca.key; default headroom-webhook-ca)",
    )
    secret.add_argument(
        "--webhook",
        help="MutatingWebhookConfiguration to set the caBundle of (default none: left alone)",
    )
    secret.add_argument(
        "--renew-before",
        type=renewal_window,
        default=datetime.timedelta(days=30),
        metavar="DURATION",
        help="re-issue the serving cert this long before it expires (default 30d); "
        "365d or more (its lifetime) re-issues it on every run: a way to force a renewal, "
        "never one to schedule",
    )
    secret.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    secret.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable)")
    add_kubeconfig(secret)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.certs_command == "secret":
        return run_secret(args)
    return run_inject(args) if args.certs_command == "inject" else run_generate(args)


def run_generate(args: argparse.Namespace) -> int:
    from certs.generate import CertificateRequestError, generate

    try:
        certificate = generate(
            args.out,
            service=args.service,
            namespace=args.namespace,
            dns=args.dns,
            ips=args.ip,
            new_ca_always=args.new_ca,
        )
    except CertificateRequestError as err:
        log.error("%s", err)
        return 2
    except OSError as err:
        log.error("cannot write to %s: %s", args.out, err)
        return 1
    print(
        f"wrote {args.out}/ca.crt, ca.key, tls.crt, tls.key "
        f"(serial {certificate.serial_number:x}, valid until "
        f"{certificate.not_valid_after_utc:%Y-%m-%d})",
        file=sys.stdout,
    )
    return 0


def run_inject(args: argparse.Namespace) -> int:
    from urllib3.exceptions import HTTPError

    from certs.inject import InjectError, inject_ca_bundle, read_ca
    from kube.config import KubeConfigError, api_client

    quiet_retries()
    try:
        ca_pem = read_ca(args.ca.read_bytes(), str(args.ca))
    except OSError as err:
        log.error("--ca %s: %s", args.ca, err)
        return 2
    except InjectError as err:
        log.error("%s", err)
        return 1
    try:
        injection = inject_ca_bundle(api_client(args.kubeconfig), args.webhook, ca_pem)
    except (InjectError, KubeConfigError) as err:
        log.error("%s", err)
        return 1
    except (HTTPError, OSError) as err:
        log.error("cannot reach the apiserver: %s", one_line(err))
        return 1
    done = "set" if injection.patched else "already set"
    print(
        f"caBundle {done} on {injection.webhooks} webhook(s) of "
        f"MutatingWebhookConfiguration {args.webhook}"
    )
    return 0


def run_secret(args: argparse.Namespace) -> int:
    from urllib3.exceptions import HTTPError

    from certs.generate import CertificateRequestError, parse_ips
    from certs.inject import InjectError
    from certs.reconciler import Request, SecretApiError, reconcile
    from certs.secrets import SecretError
    from kube.config import KubeConfigError, api_client

    quiet_retries()
    try:
        request = Request(
            namespace=args.namespace,
            service=args.service,
            secret=args.secret,
            ca_secret=args.ca_secret,
            webhook=args.webhook,
            renew_before=args.renew_before,
            dns=tuple(args.dns),
            ips=tuple(parse_ips(args.ip)),
        )
        outcome = reconcile(api_client(args.kubeconfig), request, report=print)
    except (SecretError, CertificateRequestError) as err:
        log.error("%s", err)
        return 2
    except (SecretApiError, InjectError, KubeConfigError) as err:
        log.error("%s", err)
        return 1
    except (HTTPError, OSError) as err:
        log.error("cannot reach the apiserver: %s", one_line(err))
        return 1
    print("changes written" if outcome.wrote else "in line; nothing written")
    return 0
