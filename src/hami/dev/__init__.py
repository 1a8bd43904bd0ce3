"""Developer tools: the local Kubernetes control plane used by the integration tests."""
