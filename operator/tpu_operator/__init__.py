"""tpu-operator: runs JAX training on GKE TPU node pools as TPUJob and TPUSlice resources."""

__version__ = "0.1.0"
