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
