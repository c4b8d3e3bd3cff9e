"""The built-in demo: a small bf16 transformer trained data- and model-parallel.

Run it with ``tpu-worker demo`` or ``python -m tpu_worker.demo`` (same flags). It runs
unchanged on CPU processes and on TPU, checkpoints and resumes, and has fault-injection
hooks for tests (``hooks``).
"""
