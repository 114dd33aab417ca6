{{/* Names: <release>-sluice unless the release is named sluice-something already. */}}
{{- define "sluice.fullname" -}}
{{- if contains "sluice" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sluice" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sluice.gpuImage" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-gpu" (default .Chart.AppVersion .Values.image.tag)) .Values.image.gpuTag) -}}
{{- end -}}

{{- define "sluice.publicUrl" -}}
{{- $scheme := ternary "https" "http" (not (empty .Values.proxy.tls.secretName)) -}}
{{- printf "%s://%s-proxy:%v" $scheme (include "sluice.fullname" .) .Values.proxy.service.port -}}
{{- end -}}

{{/* The checks every install passes first: one Redis, a shared storage, keys unless waived. */}}
{{- define "sluice.validate" -}}
{{- $redis := 0 -}}
{{- if .Values.redis.url }}{{ $redis = add1 $redis }}{{ end -}}
{{- if .Values.redis.sentinel.hosts }}{{ $redis = add1 $redis }}{{ end -}}
{{- if .Values.redis.internal.enabled }}{{ $redis = add1 $redis }}{{ end -}}
{{- if ne $redis 1 -}}
{{- fail "redis: set exactly one of redis.url, redis.sentinel.hosts and redis.internal.enabled" -}}
{{- end -}}
{{- if and .Values.redis.sentinel.hosts (not .Values.redis.sentinel.masterName) -}}
{{- fail "redis.sentinel.masterName: the name the sentinels monitor the primary under is required with redis.sentinel.hosts" -}}
{{- end -}}
{{- if not (or (hasPrefix "s3://" .Values.storage.url) (hasPrefix "gs://" .Values.storage.url)) -}}
{{- fail "storage.url: every host reads the deployed bundles, so it must be s3://bucket/prefix or gs://bucket/prefix" -}}
{{- end -}}
{{- if and .Values.proxy.tls.caKey (not .Values.proxy.tls.secretName) -}}
{{- fail "proxy.tls.caKey: names a key of proxy.tls.secretName, which is not set" -}}
{{- end -}}
{{- if and (not .Values.auth.apiKeysSecret.name) (not .Values.auth.allowAnonymous) -}}
{{- fail "auth.apiKeysSecret.name: API keys are required (a deploy runs code on every host); set auth.allowAnonymous=true to run without" -}}
{{- end -}}
{{- end -}}

{{/* What every Sluice container is told: Redis, storage, the public address, keys' rules. */}}
{{- define "sluice.env" -}}
{{- $full := include "sluice.fullname" . -}}
{{- if .Values.redis.internal.enabled }}
- name: SLUICE_REDIS_URL
  value: {{ printf "redis://%s-redis:6379/0" $full | quote }}
- name: SLUICE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ printf "%s-redis" $full }}, key: redis-password}
{{- else if .Values.redis.url }}
- name: SLUICE_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- else }}
- name: SLUICE_REDIS_SENTINELS
  value: {{ join "," .Values.redis.sentinel.hosts | quote }}
- name: SLUICE_REDIS_MASTER
  value: {{ .Values.redis.sentinel.masterName | quote }}
{{- with .Values.redis.sentinel.passwordSecret }}{{ if .name }}
- name: SLUICE_REDIS_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}{{ end }}
{{- end }}
{{- if not .Values.redis.internal.enabled }}{{ with .Values.redis.passwordSecret }}{{ if .name }}
- name: SLUICE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}{{ end }}{{ end }}
- name: SLUICE_STORAGE
  value: {{ .Values.storage.url | quote }}
{{- if and (hasPrefix "gs://" .Values.storage.url) .Values.storage.credentialsSecret }}
- name: GOOGLE_APPLICATION_CREDENTIALS
  value: {{ printf "/var/run/sluice/gcs/%s" .Values.storage.gcsKeyFile | quote }}
{{- end }}
- name: SLUICE_API_URL
  value: {{ include "sluice.publicUrl" . | quote }}
- name: SLUICE_URL
  value: {{ include "sluice.publicUrl" . | quote }}
{{- if .Values.proxy.tls.caKey }}
- name: SLUICE_CA_BUNDLE
  value: {{ printf "/etc/sluice/ca/%s" .Values.proxy.tls.caKey | quote }}
{{- end }}
- name: SLUICE_BATCH_TIMEOUT
  value: {{ .Values.batchTimeoutSeconds | quote }}
- name: SLUICE_ALLOW_ANONYMOUS
  value: {{ ternary "1" "0" .Values.auth.allowAnonymous | quote }}
- name: SLUICE_PROTECT_REALTIME
  value: {{ ternary "1" "0" .Values.auth.protectRealtime | quote }}
{{- range $name, $value := .Values.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* Storage credentials from a Secret, as environment variables (s3://). */}}
{{- define "sluice.envFrom" -}}
{{- if and (hasPrefix "s3://" .Values.storage.url) .Values.storage.credentialsSecret }}
envFrom:
  - secretRef: {name: {{ .Values.storage.credentialsSecret }}}
{{- end }}
{{- end -}}

{{/* The API keys file, on the API and the proxy. */}}
{{- define "sluice.keysEnv" -}}
{{- if .Values.auth.apiKeysSecret.name }}
- name: SLUICE_API_KEYS_FILE
  value: {{ printf "/etc/sluice/api-keys/%s" .Values.auth.apiKeysSecret.key | quote }}
{{- end }}
{{- end -}}

{{- define "sluice.keysVolumeMount" -}}
{{- if .Values.auth.apiKeysSecret.name }}
- {name: api-keys, mountPath: /etc/sluice/api-keys, readOnly: true}
{{- end }}
{{- end -}}

{{- define "sluice.keysVolume" -}}
{{- if .Values.auth.apiKeysSecret.name }}
- name: api-keys
  secret: {secretName: {{ .Values.auth.apiKeysSecret.name }}}
{{- end }}
{{- end -}}

{{/* The gs:// key file, where the storage client looks (GOOGLE_APPLICATION_CREDENTIALS). */}}
{{/* The CA of the public address's certificate (proxy.tls.caKey), where SLUICE_CA_BUNDLE names it. */}}
{{- define "sluice.caVolumeMount" -}}
{{- if .Values.proxy.tls.caKey }}
- {name: public-ca, mountPath: /etc/sluice/ca, readOnly: true}
{{- end }}
{{- end -}}

{{- define "sluice.caVolume" -}}
{{- if .Values.proxy.tls.caKey }}
- name: public-ca
  secret:
    secretName: {{ .Values.proxy.tls.secretName }}
    items: [{key: {{ .Values.proxy.tls.caKey }}, path: {{ .Values.proxy.tls.caKey }}}]
{{- end }}
{{- end -}}

{{- define "sluice.storageVolumeMount" -}}
{{- if and (hasPrefix "gs://" .Values.storage.url) .Values.storage.credentialsSecret }}
- {name: gcs-key, mountPath: /var/run/sluice/gcs, readOnly: true}
{{- end }}
{{- end -}}

{{- define "sluice.storageVolume" -}}
{{- if and (hasPrefix "gs://" .Values.storage.url) .Values.storage.credentialsSecret }}
- name: gcs-key
  secret: {secretName: {{ .Values.storage.credentialsSecret }}}
{{- end }}
{{- end -}}

{{/* A host pod's own identity (downward API): its name is its host id, its IP where the proxy
reaches its replicas, and both let its agent set its pod's deletion cost. */}}
{{- define "sluice.podEnv" -}}
- name: SLUICE_POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: SLUICE_POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: SLUICE_POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: SLUICE_HOST_CPU_M
  valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}
- name: SLUICE_HOST_MEM
  valueFrom: {resourceFieldRef: {resource: requests.memory, divisor: "1"}}
{{- end -}}

{{/* A pool's resources: its requests and limits, with its GPUs as nvidia.com/gpu. An extended
resource (a name with a "/": GPUs, AWS Inferentia's aws.amazon.com/neuron) is limited as requested,
as Kubernetes wants. */}}
{{- define "sluice.poolResources" -}}
{{- $requests := deepCopy (default dict .resources.requests) -}}
{{- $limits := deepCopy (default dict .resources.limits) -}}
{{- if gt (int .gpu) 0 -}}
{{- $_ := set $requests "nvidia.com/gpu" (int .gpu) -}}
{{- end -}}
{{- range $name, $amount := $requests }}{{ if contains "/" $name }}{{ $_ := set $limits $name $amount }}{{ end }}{{ end -}}
requests: {{- toYaml $requests | nindent 2 }}
{{- if $limits }}
limits: {{- toYaml $limits | nindent 2 }}
{{- end }}
{{- end -}}

{{/* SLUICE_HOST_POOLS for beat: every enabled pool and what one of its hosts offers. */}}
{{- define "sluice.hostPools" -}}
{{- $pools := list -}}
{{- range .Values.workerPools }}{{ include "sluice.poolDefaults" . }}{{ if .enabled -}}
{{- $pools = append $pools (dict "name" (printf "workers-%s" .name) "role" "workers" "hardware" .hardware "cpu" (toString .resources.requests.cpu) "mem" (toString .resources.requests.memory) "gpu" (int .gpu)) -}}
{{- end }}{{ end -}}
{{- range .Values.replicaPools }}{{ include "sluice.poolDefaults" . }}{{ if .enabled -}}
{{- $pools = append $pools (dict "name" (printf "replicas-%s" .name) "role" "replicas" "hardware" .hardware "cpu" (toString .resources.requests.cpu) "mem" (toString .resources.requests.memory) "gpu" (int .gpu)) -}}
{{- end }}{{ end -}}
{{- toJson $pools -}}
{{- end -}}

{{- define "sluice.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  fsGroup: 1000
{{- end -}}

{{/* A pool's fields left out take these (a list in values is replaced whole, never merged). */}}
{{- define "sluice.poolDefaults" -}}
{{- $defaults := dict "enabled" true "gpu" 0 "minNodes" 0 "idleGraceSeconds" 60 "replicas" 1 "cacheSizeLimit" "20Gi" "terminationGracePeriodSeconds" 90 "nodeSelector" dict "tolerations" list "autoscaling" (dict "enabled" true "minHosts" 0 "maxHosts" 10) -}}
{{- range $k, $v := $defaults }}{{ if not (hasKey $ $k) }}{{ $_ := set $ $k $v }}{{ end }}{{ end -}}
{{- end -}}
