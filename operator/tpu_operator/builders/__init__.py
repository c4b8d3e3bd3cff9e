"""Pure builders: spec in, Kubernetes object dicts out. No I/O, no cluster needed."""
