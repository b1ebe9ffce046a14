{{/* Names. */}}
{{- define "reconciler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reconciler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "reconciler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reconciler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reconciler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "reconciler.labels" -}}
helm.sh/chart: {{ include "reconciler.chart" . }}
{{ include "reconciler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "reconciler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "reconciler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "reconciler.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Refuse values the engine cannot work with, with the fix in the message.
*/}}
{{- define "reconciler.validate" -}}
{{- if gt (int .Values.replicaCount) (int .Values.partitions) }}
{{- fail (printf "replicaCount (%d) > partitions (%d): the extra pods get no partition and never become ready. Lower replicaCount or create the topics with more partitions." (int .Values.replicaCount) (int .Values.partitions)) }}
{{- end }}
{{- if eq (int .Values.metricsPort) 0 }}
{{- fail "metricsPort is 0: the engine would serve no /healthz or /readyz for the probes. Set a port (default 9464)." }}
{{- end }}
{{- if le (mul (int .Values.terminationGracePeriodSeconds) 1000) (int .Values.transactionTimeoutMs) }}
{{- fail "terminationGracePeriodSeconds must exceed transactionTimeoutMs so the SIGTERM drain can commit. Raise the grace period or lower the timeout." }}
{{- end }}
{{- if lt (int .Values.transactionTimeoutMs) (add (int .Values.commitIntervalMs) 5000) }}
{{- fail (printf "transactionTimeoutMs (%d) must be at least commitIntervalMs (%d) + 5000 so a commit ends before the broker aborts its transaction. Raise transactionTimeoutMs (and terminationGracePeriodSeconds with it) or lower commitIntervalMs." (int .Values.transactionTimeoutMs) (int .Values.commitIntervalMs)) }}
{{- end }}
{{- range $key, $value := .Values.kafka }}
{{- if or (contains "password" (lower $key)) (contains "secret" (lower $key)) }}
{{- fail (printf "kafka.%s looks secret: put it in an existing Secret and map it under kafkaSecret.keys instead of values." $key) }}
{{- end }}
{{- end }}
{{- if and .Values.sasl.enabled (not .Values.sasl.existingSecret) }}
{{- fail "sasl.enabled is true but sasl.existingSecret is empty: name the Secret that holds the engine principal's username and password." }}
{{- end }}
{{- if .Values.sasl.enabled }}
{{- range $key := list "security.protocol" "sasl.mechanism" "sasl.username" "sasl.password" }}
{{- if or (hasKey $.Values.kafka $key) (hasKey $.Values.kafkaSecret.keys $key) }}
{{- fail (printf "%s is set both by sasl.* and by kafka/kafkaSecret: keep one." $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.kafkaSecret.keys (not .Values.kafkaSecret.name) }}
{{- fail "kafkaSecret.keys is set but kafkaSecret.name is empty: name the existing Secret." }}
{{- end }}
{{- end }}

{{/*
The engine's settings as RECONCILER_* variables (engine/settings.py): shared by the StatefulSet
and the topics Job so both see the same cluster, prefix and partition count.
*/}}
{{- define "reconciler.kafkaEnv" -}}
- name: RECONCILER_BOOTSTRAP_SERVERS
  value: {{ .Values.bootstrapServers | quote }}
- name: RECONCILER_TOPIC_PREFIX
  value: {{ .Values.topicPrefix | quote }}
- name: RECONCILER_PARTITIONS
  value: {{ .Values.partitions | int64 | quote }}
- name: RECONCILER_REPLICATION_FACTOR
  value: {{ .Values.replicationFactor | int64 | quote }}
- name: RECONCILER_GROUP_ID
  value: {{ .Values.groupId | quote }}
{{- range $key, $value := .Values.kafka }}
- name: RECONCILER_KAFKA__{{ $key | upper | replace "." "_" }}
  value: {{ $value | quote }}
{{- end }}
{{- if .Values.sasl.enabled }}
- name: RECONCILER_KAFKA__SECURITY_PROTOCOL
  value: {{ .Values.sasl.securityProtocol | quote }}
- name: RECONCILER_KAFKA__SASL_MECHANISM
  value: {{ .Values.sasl.mechanism | quote }}
- name: RECONCILER_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.sasl.existingSecret }}
      key: {{ .Values.sasl.usernameKey }}
- name: RECONCILER_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.sasl.existingSecret }}
      key: {{ .Values.sasl.passwordKey }}
{{- end }}
{{- range $key, $secretKey := .Values.kafkaSecret.keys }}
- name: RECONCILER_KAFKA__{{ $key | upper | replace "." "_" }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.kafkaSecret.name }}
      key: {{ $secretKey }}
{{- end }}
{{- end }}
