"""The mutating admission webhook: AdmissionReview in, JSONPatch out.

Layers, outermost first: :mod:`webhook.service` wires everything together;
:mod:`webhook.server` speaks HTTPS and knows only a review function;
:mod:`webhook.admission` turns one request into one response with no I/O;
:mod:`webhook.cache` keeps namespaces, policies and nodes in memory.
"""
