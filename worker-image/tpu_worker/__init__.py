"""tpu_worker: the in-pod JAX worker of tpu-operator (library and ``tpu-worker`` launcher).

Training code run by the launcher reports through ``reporter()``::

    import tpu_worker

    report = tpu_worker.reporter()
    with report.data_wait():
        batch = next(batches)
    report.record_step(step, loss=loss, examples=n, tokens=t, flops=f)

See docs/concepts/worker.md for the launcher, the metrics and the settings.
"""

from tpu_worker.reporting import Reporter, reporter

__all__ = ["Reporter", "reporter"]
