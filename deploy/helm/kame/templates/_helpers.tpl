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

{{/*
The gateway's gRPC target of a component it balances over: dns:///host:port. On a headless
Service (service.headless) the name resolves to every ready pod's IP and the gateway's
round_robin channel spreads sessions over them; servers' max_connection_age makes it re-resolve.
*/}}
{{- define "kame.balancedTarget" -}}
{{- printf "dns:///%s" (include "kame.address" .) }}
{{- end }}

{{/* The Redis URL every service uses (empty when it comes from the Secret). */}}
{{/*
Name of secrets.existingSecret for a reference to one of its keys: (dict "root" $ "key" "redisPasswordKey").
*/}}
{{- define "kame.existingSecret" -}}
{{- if not .root.Values.secrets.existingSecret }}
{{- fail (printf "secrets.%s names a key of secrets.existingSecret, which is not set" .key) }}
{{- end }}
{{- .root.Values.secrets.existingSecret }}
{{- end }}

{{/* The Secret generated for the in-release Redis password (redis.auth.generatePassword). */}}
{{- define "kame.generatedRedisSecret" -}}
{{- include "kame.componentName" (dict "root" . "component" "redis-auth") }}
{{- end }}

{{/* The Secret generated for the capacity registry's key (registry.generateSecret). */}}
{{- define "kame.generatedRegistrySecret" -}}
{{- include "kame.componentName" (dict "root" . "component" "registry-secret") }}
{{- end }}

{{/*
A random value the chart generates once, base64: the installed Secret's (`lookup`) on upgrades.
An upgrade that cannot read it (an offline render: `helm template`, `--dry-run`, Argo CD) fails
rather than render a new value, which would change the password or key under running pods.
(dict "root" $ "secret" NAME "key" KEY "setting" "secrets.redisPasswordKey")
*/}}
{{- define "kame.generatedValue" -}}
{{- $installed := lookup "v1" "Secret" .root.Release.Namespace .secret }}
{{- $value := "" }}
{{- if $installed }}
{{- $value = index ($installed.data | default dict) .key | default "" }}
{{- end }}
{{- if $value }}
{{- $value }}
{{- else if .root.Release.IsUpgrade }}
{{- fail (printf "the generated Secret %s (key %s) cannot be read: an offline render (helm template, --dry-run, Argo CD) would replace it with a new random value. Name a key of secrets.existingSecret in %s instead" .secret .key .setting) }}
{{- else }}
{{- randAlphaNum 40 | b64enc }}
{{- end }}
{{- end }}

{{/* Where the capacity registry's HMAC key lives, as YAML {name, key}; empty = unsigned. */}}
{{- define "kame.registrySecretRef" -}}
{{- if .Values.secrets.registrySecretKey }}
{{- toYaml (dict "name" (include "kame.existingSecret" (dict "root" . "key" "registrySecretKey")) "key" .Values.secrets.registrySecretKey) }}
{{- else if .Values.registry.generateSecret }}
{{- toYaml (dict "name" (include "kame.generatedRegistrySecret" .) "key" "registry-secret") }}
{{- end }}
{{- end }}

{{/*
Where the Redis password lives, as YAML {name, key}; empty when Redis has none (an external Redis
without secrets.redisPasswordKey). The in-release Redis always has one.
*/}}
{{- define "kame.redisPasswordRef" -}}
{{- $secrets := .Values.secrets }}
{{- if $secrets.redisPasswordKey }}
{{- toYaml (dict "name" (include "kame.existingSecret" (dict "root" . "key" "redisPasswordKey")) "key" $secrets.redisPasswordKey) }}
{{- else if and .Values.redis.enabled .Values.redis.auth.generatePassword }}
{{- toYaml (dict "name" (include "kame.generatedRedisSecret" .) "key" "redis-password") }}
{{- else if .Values.redis.enabled }}
{{- fail "the in-release Redis requires a password: set secrets.redisPasswordKey (a key of secrets.existingSecret) or redis.auth.generatePassword=true" }}
{{- end }}
{{- end }}

{{/*
The Redis URL every service uses; empty when the whole URL comes from secrets.redisUrlKey. With a
password it reads $(REDIS_PASSWORD), which the kubelet expands from the container's own env.
*/}}
{{- define "kame.redisUrl" -}}
{{- $secrets := .Values.secrets }}
{{- $url := "" }}
{{- if .Values.redis.enabled }}
{{- $url = printf "redis://%s:6379/0" (include "kame.componentName" (dict "root" . "component" "redis")) }}
{{- else if $secrets.redisUrlKey }}
{{- $_ := include "kame.existingSecret" (dict "root" . "key" "redisUrlKey") }}
{{- if $secrets.redisPasswordKey }}
{{- fail "secrets.redisUrlKey holds the whole Redis URL: leave secrets.redisPasswordKey empty" }}
{{- end }}
{{- else }}
{{- $url = required "redis.externalUrl (or secrets.redisUrlKey) is required when redis.enabled=false" .Values.redis.externalUrl }}
{{- end }}
{{- if and $url (include "kame.redisPasswordRef" .) }}
{{- $url = regexReplaceAll "^(rediss?://)" $url "${1}:$$(REDIS_PASSWORD)@" }}
{{- end }}
{{- $url }}
{{- end }}

{{/* An env value as the service's config loader parses it: whole numbers without exponent. */}}
{{- define "kame.envValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}
{{- printf "%d" (int64 .) }}
{{- else }}
{{- printf "%v" . }}
{{- end }}
{{- end }}

{{/* An env entry from a Secret key: (dict "name" "OPENAI_API_KEY" "secret" "kame-keys" "key" "..." ["optional" true]). */}}
{{- define "kame.secretEnv" -}}
{{- $ref := dict "name" .secret "key" .key }}
{{- if .optional }}
{{- $_ := set $ref "optional" true }}
{{- end }}
{{- toYaml (list (dict "name" .name "valueFrom" (dict "secretKeyRef" $ref))) }}
{{- end }}

{{/*
Environment of a KAME service: (dict "root" $ "component" "stt" "settings" (dict ...chart-owned
fields...) "redis" bool "secretEnv" (list (dict "name" ENV "key" "<secrets.* value name>"
["optional" true]) ...)). The component's `config` map adds the other fields; chart-owned fields
win so that ports, addresses and TLS files always agree with the Services, probes and mounts.
*/}}
{{- define "kame.serviceEnv" -}}
{{- $root := .root }}
{{- $values := index $root.Values .component }}
{{- $prefix := printf "KAME_%s_" (upper .component) }}
{{- $settings := merge (dict) .settings (deepCopy ($values.config | default dict)) }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- if .redis }}
{{- with include "kame.redisPasswordRef" $root | fromYaml }}
{{ include "kame.secretEnv" (dict "name" "REDIS_PASSWORD" "secret" .name "key" .key) }}
{{- end }}
{{- end }}
{{- range $field := keys $settings | sortAlpha }}
- name: {{ printf "%s%s" $prefix (upper $field) }}
  value: {{ include "kame.envValue" (index $settings $field) | quote }}
{{- end }}
{{- if and .redis (not $root.Values.redis.enabled) $root.Values.secrets.redisUrlKey }}
{{ include "kame.secretEnv" (dict "name" (printf "%sREDIS_URL" $prefix) "secret" (include "kame.existingSecret" (dict "root" $root "key" "redisUrlKey")) "key" $root.Values.secrets.redisUrlKey) }}
{{- end }}
{{- range .secretEnv }}
{{- $key := index $root.Values.secrets .key }}
{{- if eq .key "registrySecretKey" }}
{{- $name := .name }}
{{- with include "kame.registrySecretRef" $root | fromYaml }}
{{ include "kame.secretEnv" (dict "name" $name "secret" .name "key" .key) }}
{{- end }}
{{- else if $key }}
{{ include "kame.secretEnv" (dict "name" .name "secret" (include "kame.existingSecret" (dict "root" $root "key" .key)) "key" $key "optional" .optional) }}
{{- end }}
{{- end }}
{{- with $values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Where the TLS Secrets are mounted (read-only, whole Secrets so that updates reach the files). */}}
{{- define "kame.tlsDir" -}}/etc/kame/tls{{- end }}

{{/* Name of a TLS Secret: its existingSecret, or the one the chart's Certificate writes. */}}
{{- define "kame.tlsSecret" -}}
{{- $block := index .root.Values.tls .name }}
{{- if $block.existingSecret }}
{{- $block.existingSecret }}
{{- else if .root.Values.tls.certManager.enabled }}
{{- include "kame.componentName" (dict "root" .root "component" (printf "%s-tls" .name)) }}
{{- else }}
{{- fail (printf "tls.%s.enabled needs tls.%s.existingSecret or tls.certManager.enabled" .name .name) }}
{{- end }}
{{- end }}

{{/*
TLS of a component as YAML {settings, volumes, mounts}: (dict "root" $ "component" "gateway").
The gateway serves tls.gateway to clients and presents tls.internal to its upstreams;
frontend, stt and oracle serve tls.internal and require client certificates from its CA.
*/}}
{{- define "kame.tls" -}}
{{- $tls := .root.Values.tls }}
{{- $dir := include "kame.tlsDir" . }}
{{- $settings := dict }}
{{- $secrets := dict }}
{{- $internal := printf "%s/internal" $dir }}
{{- if eq .component "gateway" }}
{{- if $tls.gateway.enabled }}
{{- $_ := set $secrets "gateway" (include "kame.tlsSecret" (dict "root" .root "name" "gateway")) }}
{{- $_ = set $settings "tls_cert_file" (printf "%s/gateway/tls.crt" $dir) }}
{{- $_ = set $settings "tls_key_file" (printf "%s/gateway/tls.key" $dir) }}
{{- with $tls.gateway.clientCaSecret }}
{{- $_ = set $secrets "client-ca" . }}
{{- $_ = set $settings "tls_client_ca_file" (printf "%s/client-ca/ca.crt" $dir) }}
{{- end }}
{{- end }}
{{- if $tls.internal.enabled }}
{{- $_ := set $settings "upstream_ca_file" (printf "%s/ca.crt" $internal) }}
{{- $_ = set $settings "upstream_cert_file" (printf "%s/tls.crt" $internal) }}
{{- $_ = set $settings "upstream_key_file" (printf "%s/tls.key" $internal) }}
{{- $_ = set $settings "upstream_server_name" (required "tls.internal.serverName is required" $tls.internal.serverName) }}
{{- end }}
{{- else if $tls.internal.enabled }}
{{- $_ := set $settings "tls_cert_file" (printf "%s/tls.crt" $internal) }}
{{- $_ = set $settings "tls_key_file" (printf "%s/tls.key" $internal) }}
{{- $_ = set $settings "tls_client_ca_file" (printf "%s/ca.crt" $internal) }}
{{- end }}
{{- if $tls.internal.enabled }}
{{- $_ := set $secrets "internal" (include "kame.tlsSecret" (dict "root" .root "name" "internal")) }}
{{- end }}
{{- $volumes := list }}
{{- $mounts := list }}
{{- range $name := keys $secrets | sortAlpha }}
{{- /* 288 = 0440: readable by the pod's group (fsGroup), nobody else. */}}
{{- $volumes = append $volumes (dict "name" (printf "tls-%s" $name) "secret" (dict "secretName" (index $secrets $name) "defaultMode" 288)) }}
{{- $mounts = append $mounts (dict "name" (printf "tls-%s" $name) "mountPath" (printf "%s/%s" $dir $name) "readOnly" true) }}
{{- end }}
{{- toYaml (dict "settings" $settings "volumes" $volumes "mounts" $mounts) }}
{{- end }}

{{/* Chart-owned settings shared by every KAME gRPC service, TLS included. */}}
{{- define "kame.commonSettings" -}}
{{- $values := index .root.Values .component }}
{{- $settings := dict "port" $values.port "metrics_port" $values.metricsPort "health_port" $values.healthPort "grace_s" $values.graceS "max_sessions" $values.maxSessions }}
{{- with .root.Values.tracing.otlpEndpoint }}
{{- $_ := set $settings "otlp_endpoint" . }}
{{- end }}
{{- if .redis }}
{{- $redisUrl := include "kame.redisUrl" .root }}
{{- if $redisUrl }}
{{- $_ := set $settings "redis_url" $redisUrl }}
{{- end }}
{{- end }}
{{- $tls := include "kame.tls" . | fromYaml }}
{{- toYaml (merge $settings $tls.settings) }}
{{- end }}

{{/* terminationGracePeriodSeconds: preStop sleep + the service's grace + a margin. */}}
{{- define "kame.terminationGrace" -}}
{{- add .root.Values.drain.preStopSleepS (int (ceil (index .root.Values .component).graceS)) .root.Values.drain.marginS }}
{{- end }}

{{/*
Deployment of a KAME gRPC service with native gRPC probes on its plaintext health port, drain on
SIGTERM, resource requests and its TLS Secrets mounted: (dict "root" $ "component" "stt" "env"
<env YAML> "volumes" <list> "volumeMounts" <list> "podSpec" <extra pod spec YAML> "resources"
<resources dict>).
*/}}
{{- define "kame.grpcDeployment" -}}
{{- $root := .root }}
{{- $values := index $root.Values .component }}
{{- $ctx := dict "root" $root "component" .component }}
{{- $tls := include "kame.tls" $ctx | fromYaml }}
{{- $volumes := concat (list (dict "name" "tmp" "emptyDir" dict)) (.volumes | default list) $tls.volumes }}
{{- $mounts := concat (list (dict "name" "tmp" "mountPath" "/tmp")) (.volumeMounts | default list) $tls.mounts }}
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
            - name: health
              containerPort: {{ $values.healthPort }}
              protocol: TCP
          env:
            {{- .env | trim | nindent 12 }}
          # Native gRPC probes on grpc.health.v1 at the plaintext health port (the kubelet cannot
          # speak the service's TLS). Startup covers model load; readiness turns false as soon as
          # a drain starts (NOT_SERVING), and on the gateway while stt, the oracle or every
          # frontend is not serving; startup and liveness ask the "liveness" service, which
          # stays SERVING while the process works (restarting a gateway whose upstreams are
          # down would only drop its calls).
          startupProbe:
            grpc:
              port: {{ $values.healthPort }}
              service: liveness
            periodSeconds: {{ $values.startupProbe.periodSeconds }}
            failureThreshold: {{ $values.startupProbe.failureThreshold }}
            timeoutSeconds: 5
          readinessProbe:
            grpc:
              port: {{ $values.healthPort }}
            periodSeconds: 5
            failureThreshold: 2
            timeoutSeconds: 5
          livenessProbe:
            grpc:
              port: {{ $values.healthPort }}
              service: liveness
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
            {{- toYaml $mounts | nindent 12 }}
      volumes:
        {{- toYaml $volumes | nindent 8 }}
{{- end }}

{{/* The in-cluster Service of a component: gRPC, metrics and health ports. */}}
{{- define "kame.grpcService" -}}
{{- $values := index .root.Values .component }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "kame.componentName" . }}
  labels:
    {{- include "kame.labels" . | nindent 4 }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: ClusterIP
  {{- if $values.service.headless }}
  # Headless: DNS answers with the pod IPs, so the gateway balances per pod (round_robin).
  clusterIP: None
  {{- end }}
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
    - name: health
      port: {{ $values.healthPort }}
      targetPort: health
      protocol: TCP
      appProtocol: grpc
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

{{/* "true" when the web page is installed: web.enabled, and a gateway that does not require client
certificates (tls.gateway.clientCaSecret), which the web bridge does not present. */}}
{{- define "kame.webEnabled" -}}
{{- if and .Values.web.enabled (not .Values.tls.gateway.clientCaSecret) }}true{{ end }}
{{- end }}

{{/* "true" when the telephony service is installed: telephony.enabled, and a gateway that does not
require client certificates (tls.gateway.clientCaSecret), which telephony does not present. */}}
{{- define "kame.telephonyEnabled" -}}
{{- if and .Values.telephony.enabled (not .Values.tls.gateway.clientCaSecret) }}true{{ end }}
{{- end }}

{{/* The telephony ports phones and PBXs reach (Service ports): SIP over UDP, HTTP (Twilio's webhook
and Media Streams), AudioSocket; with telephony.service.rtp on a published Service (.public),
each RTP port too (a Service has no port ranges). */}}
{{- define "kame.telephonyPorts" -}}
{{- $values := .root.Values.telephony }}
- name: sip
  port: {{ $values.sipPort }}
  targetPort: sip
  protocol: UDP
- name: http
  port: {{ $values.port }}
  targetPort: http
  protocol: TCP
  appProtocol: http
- name: audiosocket
  port: {{ $values.audiosocketPort }}
  targetPort: audiosocket
  protocol: TCP
{{- if and .public $values.service.rtp }}
{{- range $port := untilStep (int $values.rtpPortFirst) (int (add1 $values.rtpPortLast)) 1 }}
- name: rtp-{{ $port }}
  port: {{ $port }}
  targetPort: {{ $port }}
  protocol: UDP
{{- end }}
{{- end }}
{{- end }}
