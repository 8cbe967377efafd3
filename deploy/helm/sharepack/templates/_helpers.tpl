{{/* Each template mirrors the deploy/base file of the same path; only values differ. */}}

{{/* The extender's namespace (Pod Security `restricted`) and the agent's (`privileged`). */}}
{{- define "sharepack.namespace" -}}
{{ .Values.namespace.name }}
{{- end }}

{{- define "sharepack.agentNamespace" -}}
{{- if eq .Values.namespace.agent .Values.namespace.name -}}
{{- fail (printf "namespace.agent and namespace.name are both %q: the agent needs the privileged Pod Security level, the extender's namespace enforces restricted; give the agent its own namespace" .Values.namespace.name) -}}
{{- end -}}
{{ .Values.namespace.agent }}
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

{{/* Egress of both NetworkPolicies: DNS and the API server only. */}}
{{- define "sharepack.egress" }}
  egress:
  - to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.dns.namespace }}
      podSelector:
        {{- toYaml .Values.networkPolicy.dns.podSelector | nindent 8 }}
    ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
  - ports:
    {{- range .Values.networkPolicy.apiServerPorts }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
    {{- with .Values.networkPolicy.apiServerCIDRs }}
    to:
    {{- range . }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
    {{- end }}
{{- end }}
