"""Prometheus metrics of the webhook, on a registry of its own.

A registry per server (not the process-wide default) lets tests and the
benchmark run several servers in one process without name clashes.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Admission is sub-millisecond when healthy and the apiserver gives up at
# timeoutSeconds (default 10 s): buckets cover both ends.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "headroom_webhook_admissions_total",
            "Admission requests answered, by outcome (mutated, unchanged, skipped, denied, busy, "
            "dry-run, no-policy, invalid-policy, bad-request, too-large, error) and policy.",
            ["outcome", "policy"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "headroom_webhook_admission_duration_seconds",
            "Time from the request's body being read to the response being built.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.invalid_policies = Gauge(
            "headroom_webhook_invalid_policies",
            "GPUSharingPolicy objects that failed validation and are treated as missing.",
            registry=self.registry,
        )
        self.certificate_reloads = Counter(
            "headroom_webhook_certificate_reloads_total",
            "Serving certificate reloads from --cert-dir, by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "headroom_webhook_certificate_expiry_timestamp_seconds",
            "Unix time at which the serving certificate in use expires.",
            registry=self.registry,
        )

    def observe(self, outcome: str, policy: str, seconds: float) -> None:
        self.admissions.labels(outcome, policy).inc()
        self.latency.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
