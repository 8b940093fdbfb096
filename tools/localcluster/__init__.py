"""localcluster: GCP-like "VM" containers for the hostnet.llamafactory demo and tests."""
