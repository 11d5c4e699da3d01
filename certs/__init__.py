"""Certificates for the webhook: a private CA, the serving cert, caBundle injection."""
