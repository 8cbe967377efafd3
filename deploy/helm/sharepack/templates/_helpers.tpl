{{/* Each template mirrors the deploy/base file of the same path; only values differ. */}}

{{- define "sharepack.namespace" -}}
{{ .Values.namespace.name }}
{{- end }}

{{- define "sharepack.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The agent's `default` config, from config.allocationPolicy, migStrategy and sharing. */}}
{{- define "sharepack.defaultConfig" -}}
version: v1
flags:
  migStrategy: {{ .Values.config.migStrategy }}
  failOnInitError: true
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
    sharedDevicesAllocationPolicy: {{ .Values.config.allocationPolicy }}
{{- with .Values.config.sharing }}
sharing:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "sharepack.kubeletDir" -}}
{{ trimSuffix "/" .Values.agent.kubeletRootDir }}
{{- end }}

{{/* The scheduler configuration's extender entries share these: mutual TLS (the extender
serves the verbs only to a client certificate its CA signed), timeout, names-only node cache,
and ignorable (an extender outage must not stop scheduling). */}}
{{- define "sharepack.schedulerExtenderConnection" -}}
enableHTTPS: true
tlsConfig:
  certFile: {{ .Values.scheduler.tls.certFile }}
  keyFile: {{ .Values.scheduler.tls.keyFile }}
  caFile: {{ .Values.scheduler.tls.caFile }}
  {{- with .Values.scheduler.tls.serverName }}
  serverName: {{ . }}
  {{- end }}
httpTimeout: {{ .Values.scheduler.httpTimeout }}
nodeCacheCapable: true
ignorable: true
{{- end }}
