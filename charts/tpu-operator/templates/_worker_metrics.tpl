{{- /*
Generated from operator/tpu_operator/worker_metrics.py by
`tpu-operator dashboards --write` (make dashboards): do not edit.
The worker's metric names, keyed by their constants' names, as YAML; the alert
rules read them with include and fromYaml.
*/ -}}
{{- define "tpu-operator.workerMetrics" -}}
STEPS_TOTAL: tpu_worker_steps_total
STEP: tpu_worker_step
STEP_DURATION_SECONDS: tpu_worker_step_duration_seconds
STEP_DURATION_SECONDS_BUCKET: tpu_worker_step_duration_seconds_bucket
STEP_DURATION_SECONDS_SUM: tpu_worker_step_duration_seconds_sum
STEP_DURATION_SECONDS_COUNT: tpu_worker_step_duration_seconds_count
EXAMPLES_TOTAL: tpu_worker_examples_total
TOKENS_TOTAL: tpu_worker_tokens_total
MODEL_FLOPS_TOTAL: tpu_worker_model_flops_total
PEAK_FLOPS_PER_SECOND: tpu_worker_peak_flops_per_second
LOSS: tpu_worker_loss
LAST_PROGRESS_TIMESTAMP_SECONDS: tpu_worker_last_progress_timestamp_seconds
PHASE_SECONDS_TOTAL: tpu_worker_phase_seconds_total
START_TIME_SECONDS: tpu_worker_start_time_seconds
END_TIME_SECONDS: tpu_worker_end_time_seconds
WATCHDOG_THRESHOLD_SECONDS: tpu_worker_watchdog_threshold_seconds
DEVICE_MEMORY_USED_BYTES: tpu_worker_device_memory_used_bytes
DEVICE_MEMORY_LIMIT_BYTES: tpu_worker_device_memory_limit_bytes
DEVICE_MEMORY_PEAK_USED_BYTES: tpu_worker_device_memory_peak_used_bytes
BUILD_INFO: tpu_worker_build_info
CHECKPOINT_REQUESTS_TOTAL: tpu_worker_checkpoint_requests_total
{{- end -}}
