"""Deploying a job on Kubernetes: manifests rendered from the spec, and applied."""
