"""``headroom certs``: the webhook's CA and serving certificate, and its caBundle.

  headroom certs generate --service NAME --namespace NS [--ip IP] [--dns NAME] --out DIR
  headroom certs inject --webhook NAME --ca DIR/ca.crt [--kubeconfig PATH]

``generate`` reuses the CA already in DIR (so rotating the serving certificate
needs no new caBundle) unless --new-ca is given.
"""

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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
    inject.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
    from certs.inject import InjectError, inject_ca_bundle, read_ca
    from kube.config import KubeConfigError, api_client

    try:
        ca_pem = read_ca(args.ca.read_bytes(), str(args.ca))
        count = inject_ca_bundle(api_client(args.kubeconfig), args.webhook, ca_pem)
    except OSError as err:
        log.error("--ca %s: %s", args.ca, err)
        return 2
    except (InjectError, KubeConfigError) as err:
        log.error("%s", err)
        return 1
    print(f"caBundle set on {count} webhook(s) of MutatingWebhookConfiguration {args.webhook}")
    return 0
