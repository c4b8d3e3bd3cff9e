{{- define "tpu-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tpu-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tpu-operator.labels" -}}
{{ include "tpu-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tpu-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tpu-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tpu-operator.leaseName" -}}
{{- default (include "tpu-operator.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "tpu-operator.controlKeySecret" -}}
{{- default (printf "%s-control-key" (include "tpu-operator.fullname" .)) .Values.inPlaceRestarts.existingSecret -}}
{{- end -}}

{{- define "tpu-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The rules the operator needs in every namespace it manages. */}}
{{- define "tpu-operator.namespacedRules" -}}
- apiGroups: [tpu-operator.dev]
  resources: [tpujobs]
  verbs: [get, list, watch, delete]
- apiGroups: [tpu-operator.dev]
  resources: [tpuslices]
  verbs: [get, list, watch, create, patch]
- apiGroups: [tpu-operator.dev]
  resources: [tpujobs/status, tpuslices/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
# Headless Services: listed at start and every resync (which exist), read when a create
# finds one of that name (whose it is).
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create]
{{- if .Values.inPlaceRestarts.enabled }}
# In-place restarts: one Secret per TPUJob with its control-channel key, created and
# never read back (the key is derived from the operator's master key and the job's UID).
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
{{- end }}
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
# Queued provisioning outside Kueue (placement.capacity: QueuedProvisioning,
# docs/tasks/capacity.md): a PodTemplate and a ProvisioningRequest per slice and try,
# created, the request read while the slice waits for it, and both deleted when the job
# falls back to capacity of another kind (placement.fallbacks).
- apiGroups: [""]
  resources: [podtemplates]
  verbs: [create, delete]
- apiGroups: [autoscaling.x-k8s.io]
  resources: [provisioningrequests]
  verbs: [get, create, delete]
{{- if .Values.kueue.enabled }}
# Kueue integration (docs/tasks/kueue.md): one Workload per queued TPUJob; patch deactivates
# and reactivates it around a suspend (spec.active).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [get, patch]
{{- end }}
{{- end -}}

{{- define "tpu-operator.metricsReader" -}}
{{- printf "%s-metrics-reader" (include "tpu-operator.fullname" .) -}}
{{- end -}}

{{- define "tpu-operator.metricsScraper" -}}
{{- printf "%s-metrics-scraper" (include "tpu-operator.fullname" .) -}}
{{- end -}}
