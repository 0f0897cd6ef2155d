{{/* Names and labels. */}}
{{- define "kame.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kame.fullname" -}}
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

{{/* Name of one component's objects: (dict "root" $ "component" "stt") */}}
{{- define "kame.componentName" -}}
{{- printf "%s-%s" (include "kame.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kame.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kame.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kame.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "kame.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kame
{{- end }}

{{- define "kame.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kame.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference of a KAME component: (dict "root" $ "image" .Values.stt.image) */}}
{{- define "kame.image" -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default (printf "%s%s" .root.Chart.AppVersion (.image.tagSuffix | default "")) }}
{{- $repository := .image.repository }}
{{- if .root.Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .root.Values.image.registry) .image.repository }}
{{- end }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{/* In-cluster address host:port of a component's gRPC Service. */}}
{{- define "kame.address" -}}
{{- printf "%s:%v" (include "kame.componentName" .) (index .root.Values .component).port }}
{{- end }}

{{/* The Redis URL every service uses (empty when it comes from the Secret). */}}
{{- define "kame.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s:6379/0" (include "kame.componentName" (dict "root" . "component" "redis")) }}
{{- else if .Values.secrets.redisUrlKey }}
{{- if not .Values.secrets.existingSecret }}
{{- fail "secrets.redisUrlKey names a key of secrets.existingSecret, which is not set" }}
{{- end }}
{{- else }}
{{- required "redis.externalUrl (or secrets.redisUrlKey) is required when redis.enabled=false" .Values.redis.externalUrl }}
{{- end }}
{{- end }}

{{/* An env value as the service's config loader parses it: whole numbers without exponent. */}}
{{- define "kame.envValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}
{{- printf "%d" (int64 .) }}
{{- else }}
{{- printf "%v" . }}
{{- end }}
{{- end }}

{{/*
Environment of a KAME service: (dict "root" $ "component" "stt" "prefix" "KAME_STT_"
"settings" (dict ...chart-owned fields...)). The component's `config` map adds the other fields;
chart-owned fields win so that ports and addresses always agree with the Services and probes.
*/}}
{{- define "kame.serviceEnv" -}}
{{- $values := index .root.Values .component }}
{{- $settings := merge (dict) .settings (deepCopy ($values.config | default dict)) }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- range $field := keys $settings | sortAlpha }}
- name: {{ printf "%s%s" $.prefix (upper $field) }}
  value: {{ include "kame.envValue" (index $settings $field) | quote }}
{{- end }}
{{- if and .redis (not .root.Values.redis.enabled) .root.Values.secrets.redisUrlKey }}
- name: {{ printf "%sREDIS_URL" .prefix }}
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.secrets.existingSecret }}
      key: {{ .root.Values.secrets.redisUrlKey }}
{{- end }}
{{- with $values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Chart-owned settings shared by every KAME gRPC service. */}}
{{- define "kame.commonSettings" -}}
{{- $values := index .root.Values .component }}
{{- $settings := dict "port" $values.port "metrics_port" $values.metricsPort "grace_s" $values.graceS "max_sessions" $values.maxSessions }}
{{- with .root.Values.tracing.otlpEndpoint }}
{{- $_ := set $settings "otlp_endpoint" . }}
{{- end }}
{{- if .redis }}
{{- $redisUrl := include "kame.redisUrl" .root }}
{{- if $redisUrl }}
{{- $_ := set $settings "redis_url" $redisUrl }}
{{- end }}
{{- end }}
{{- toYaml $settings }}
{{- end }}

{{/* terminationGracePeriodSeconds: preStop sleep + the service's grace + a margin. */}}
{{- define "kame.terminationGrace" -}}
{{- add .root.Values.drain.preStopSleepS (int (ceil (index .root.Values .component).graceS)) .root.Values.drain.marginS }}
{{- end }}

{{/*
Deployment of a KAME gRPC service with native gRPC probes, drain on SIGTERM and resource
requests: (dict "root" $ "component" "stt" "env" <env YAML> "volumes" <YAML> "volumeMounts" <YAML>
"podSpec" <extra pod spec YAML> "resources" <resources dict>).
*/}}
{{- define "kame.grpcDeployment" -}}
{{- $root := .root }}
{{- $values := index $root.Values .component }}
{{- $ctx := dict "root" $root "component" .component }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "kame.componentName" $ctx }}
  labels:
    {{- include "kame.labels" $ctx | nindent 4 }}
spec:
  {{- if not (and $values.autoscaling $values.autoscaling.enabled) }}
  replicas: {{ $values.replicaCount }}
  {{- end }}
  revisionHistoryLimit: 3
  selector:
    matchLabels:
      {{- include "kame.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "kame.selectorLabels" $ctx | nindent 8 }}
        {{- with $values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        {{- if $root.Values.metrics.podAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $values.metricsPort | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- with $values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "kame.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ include "kame.terminationGrace" $ctx }}
      {{- with .podSpec }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with $values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "kame.image" (dict "root" $root "image" $values.image) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["python", "-m", "services.{{ .component }}"]
          ports:
            - name: grpc
              containerPort: {{ $values.port }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $values.metricsPort }}
              protocol: TCP
          env:
            {{- .env | trim | nindent 12 }}
          # Native gRPC probes on grpc.health.v1 (registered by every service). Startup covers
          # model load; readiness turns false as soon as a drain starts (NOT_SERVING).
          startupProbe:
            grpc:
              port: {{ $values.port }}
            periodSeconds: {{ $values.startupProbe.periodSeconds }}
            failureThreshold: {{ $values.startupProbe.failureThreshold }}
            timeoutSeconds: 5
          readinessProbe:
            grpc:
              port: {{ $values.port }}
            periodSeconds: 5
            failureThreshold: 2
            timeoutSeconds: 5
          livenessProbe:
            grpc:
              port: {{ $values.port }}
            periodSeconds: 10
            failureThreshold: 3
            timeoutSeconds: 5
          lifecycle:
            preStop:
              exec:
                command: ["sleep", "{{ $root.Values.drain.preStopSleepS }}"]
          resources:
            {{- toYaml .resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with .volumeMounts }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {}
        {{- with .volumes }}
        {{- . | nindent 8 }}
        {{- end }}
{{- end }}

{{/* ClusterIP (or LoadBalancer) Service with the gRPC and metrics ports. */}}
{{- define "kame.grpcService" -}}
{{- $values := index .root.Values .component }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "kame.componentName" . }}
  labels:
    {{- include "kame.labels" . | nindent 4 }}
  {{- with $values.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ $values.service.type }}
  selector:
    {{- include "kame.selectorLabels" . | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $values.port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ $values.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- end }}

{{/* PodDisruptionBudget of a component, when enabled. */}}
{{- define "kame.pdb" -}}
{{- $values := index .root.Values .component }}
{{- if $values.pdb.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "kame.componentName" . }}
  labels:
    {{- include "kame.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ $values.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "kame.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}
