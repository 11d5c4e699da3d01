"""One way to get an API client: a kubeconfig path, else in-cluster, else ~/.kube/config."""

import os

from kubernetes import client, config


class KubeConfigError(RuntimeError):
    """No usable credentials; the message says where Headroom looked."""


def api_client(kubeconfig: str | None = None, *, pool: int | None = None) -> client.ApiClient:
    """An ApiClient from ``kubeconfig``, the in-cluster service account, or $KUBECONFIG.

    ``pool``: connections kept to the apiserver (the client's default is 5 per
    CPU); a caller that sends many requests at once sizes it to match.
    """
    configuration = client.Configuration()
    if pool is not None:
        configuration.connection_pool_maxsize = pool
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as err:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "in-cluster / ~/.kube/config"
        raise KubeConfigError(f"cannot load Kubernetes credentials from {where}: {err}") from err
    return client.ApiClient(configuration)
