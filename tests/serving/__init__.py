"""Tests of serving: what the shells share to serve HTTP to untrusted clients."""
