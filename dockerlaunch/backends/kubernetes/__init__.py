"""Kubernetes: an Indexed Job + headless Service, or a JobSet, from the job plan (`render --to k8s|jobset`)."""
