{{/*
Chart name, truncated to fit a DNS label.
*/}}
{{- define "chorus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name. Truncated to 40 characters so that suffixes such as
"-worker-<pool>" and the ReplicaSet/pod hashes still fit the 63-character limit.
*/}}
{{- define "chorus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "chorus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "chorus.labels" -}}
helm.sh/chart: {{ include "chorus.chart" . }}
{{ include "chorus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels (stable: Deployment selectors are immutable).
*/}}
{{- define "chorus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chorus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "chorus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "chorus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "chorus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "chorus.configMapName" -}}
{{- printf "%s-config" (include "chorus.fullname" .) }}
{{- end }}

{{/*
The Secret every Chorus pod loads: existingSecret, or the chart's own.
*/}}
{{- define "chorus.secretName" -}}
{{- if .Values.existingSecret }}
{{- .Values.existingSecret }}
{{- else }}
{{- printf "%s-env" (include "chorus.fullname" .) }}
{{- end }}
{{- end }}

{{/*
A value for a ConfigMap or Secret: YAML numbers in values files arrive as
float64, so render integral ones without an exponent (1000000, not 1e+06).
*/}}
{{- define "chorus.envValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}
{{- int64 . | toString | quote }}
{{- else }}
{{- toString . | quote }}
{{- end }}
{{- end }}

{{/*
Pod annotations of a Chorus pod, as YAML: config and secret checksums (a
change rolls the pods), prometheus.io annotations when prometheus.annotate
includes pods and the pod serves metrics, the global podAnnotations, then the
component's own. Arguments: root; optional port and path (of the metrics
endpoint) and extra (annotations).
*/}}
{{- define "chorus.podAnnotations" -}}
{{- $root := .root }}
{{- $annotations := dict "checksum/config" (include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum) }}
{{- if not $root.Values.existingSecret }}
{{- $_ := set $annotations "checksum/secret" (include (print $root.Template.BasePath "/secret.yaml") $root | sha256sum) }}
{{- end }}
{{- if .port }}
{{- $prometheus := include "chorus.prometheusAnnotations" (dict "root" $root "where" "pods" "port" .port "path" .path) | fromYaml }}
{{- $annotations = mergeOverwrite $annotations ($prometheus | default dict) }}
{{- end }}
{{- $annotations = mergeOverwrite $annotations ($root.Values.podAnnotations | default dict) (.extra | default dict) }}
{{- toYaml $annotations }}
{{- end }}

{{/*
prometheus.io annotations for an HTTP endpoint, if prometheus.annotate asks
for them on this kind of object. Arguments: root, where ("pods" or
"services"), port.
*/}}
{{- define "chorus.prometheusAnnotations" -}}
{{- $annotate := .root.Values.prometheus.annotate }}
{{- if or (eq $annotate "both") (eq $annotate .where) }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | toString | quote }}
prometheus.io/path: {{ .path | default "/metrics" | quote }}
{{- end }}
{{- end }}

{{/*
Environment of every Chorus container: the ConfigMap, then the Secret (its
keys win).
*/}}
{{- define "chorus.envFrom" -}}
{{ include "chorus.configEnvFrom" . }}
- secretRef:
    name: {{ include "chorus.secretName" . }}
{{- end }}

{{/*
The ConfigMap alone: pods that never call a model (beat, Flower, the
exporter) take only the Secret's keys they need (chorus.secretEnv), not
the provider keys the workers get.
*/}}
{{- define "chorus.configEnvFrom" -}}
- configMapRef:
    name: {{ include "chorus.configMapName" . }}
{{- end }}

{{/*
EnvVars read from the Secret, one key each. Arguments: root, required (keys
the pod cannot start without), optional (keys it takes if present).
*/}}
{{- define "chorus.secretEnv" -}}
{{- $name := include "chorus.secretName" .root }}
{{- range .required }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ $name }}
      key: {{ . }}
{{- end }}
{{- range .optional }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ $name }}
      key: {{ . }}
      optional: true
{{- end }}
{{- end }}

{{/*
Volumes every Chorus pod mounts: a writable /tmp and the state directory
(the root filesystem is read-only by default).
*/}}
{{- define "chorus.volumes" -}}
- name: tmp
  emptyDir: {}
- name: state
  emptyDir: {}
{{- end }}

{{- define "chorus.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: state
  mountPath: {{ .Values.config.CHORUS_STATE_DIR | default "/var/lib/chorus" }}
{{- end }}

{{/*
Pod-level settings shared by every Chorus pod.
*/}}
{{- define "chorus.podSpecCommon" -}}
serviceAccountName: {{ include "chorus.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Scheduling constraints. Arguments: root, and an optional override dict whose
non-empty nodeSelector / tolerations / affinity replace the global ones.
*/}}
{{- define "chorus.scheduling" -}}
{{- $over := .override | default dict }}
{{- with ($over.nodeSelector | default .root.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($over.tolerations | default .root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($over.affinity | default .root.Values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A DNS-label-safe worker pool name, or fail.
*/}}
{{- define "chorus.checkPoolName" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) }}
{{- fail (printf "workers.pools: %q is not a valid pool name (lowercase letters, digits and '-')" .) }}
{{- end }}
{{- if gt (len .) 15 }}
{{- fail (printf "workers.pools: pool name %q is longer than 15 characters" .) }}
{{- end }}
{{- end }}
