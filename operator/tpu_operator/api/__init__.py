"""The TPUJob and TPUSlice API (v1alpha1): pydantic models, the single source of truth.

The CRD YAML in ``crds/`` and in the Helm chart is generated from these models by
``tpu_operator.crdgen`` (``tpu-operator crds``).
"""

from tpu_operator.api.job import TPUJobSpec, TPUJobStatus
from tpu_operator.api.slice import TPUSliceSpec, TPUSliceStatus

__all__ = ["TPUJobSpec", "TPUJobStatus", "TPUSliceSpec", "TPUSliceStatus"]
