"""Kubernetes: an Indexed Job + headless Service, or a JobSet, from the job plan (`render --to k8s|jobset`)."""

from dockerlaunch.backends.renderers import Flag

FLAGS = (
    Flag("host-network", "k8s/jobset: pods on the nodes' network.", is_flag=True),
    Flag("rdma-resource", "k8s/jobset: a pod's RDMA resource [rdma/rdma_shared_device_a].", metavar="NAME"),
    Flag("namespace", "k8s/jobset: metadata.namespace of the objects.", metavar="NS"),
)


def options(target: str, values: dict):
    """The flags, checked: a bad namespace or resource name is one line naming the flag."""
    from dockerlaunch.backends.kubernetes import objects as k8s
    from dockerlaunch.errors import ConfigError

    namespace, rdma = values.get("namespace"), values.get("rdma_resource")
    if namespace is not None and not k8s.DNS_LABEL.match(namespace):
        raise ConfigError(f"--namespace {namespace!r}: a Kubernetes namespace is a DNS label (a-z, 0-9, '-')")
    if rdma is not None and not k8s.RESOURCE_NAME.match(rdma):
        raise ConfigError(f"--rdma-resource {rdma!r}: an extended resource is DOMAIN/NAME, "
                          "e.g. rdma/rdma_shared_device_a")
    return k8s.Options(target=target, host_network=bool(values.get("host_network")),
                       rdma_resource=rdma or k8s.RDMA_RESOURCE, namespace=namespace)


def render(plan, options=None) -> list:
    from dockerlaunch.backends.kubernetes import objects as k8s

    return k8s.render(plan, options or k8s.Options())
