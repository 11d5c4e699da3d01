"""What every shell needs from the Kubernetes API: a client and list-watch caches."""
