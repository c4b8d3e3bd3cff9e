"""A small JAX training package, run by the worker: ``tpu-worker run -m my_trainer.train``."""
