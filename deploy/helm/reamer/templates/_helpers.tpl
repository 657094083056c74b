{{/* The labels of a component's objects: (dict "component" NAME "root" $). */}}
{{- define "reamer.labels" -}}
app.kubernetes.io/name: reamer
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: reamer
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* What selects a component's pods (never changes across upgrades). */}}
{{- define "reamer.selector" -}}
app.kubernetes.io/component: {{ . }}
app.kubernetes.io/name: reamer
{{- end -}}

{{- define "reamer.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* policy/v1 where the cluster serves it (1.21+), else policy/v1beta1; or as set. */}}
{{- define "reamer.pdbApiVersion" -}}
{{- if .Values.podDisruptionBudgetApiVersion -}}
{{ .Values.podDisruptionBudgetApiVersion }}
{{- else if .Capabilities.APIVersions.Has "policy/v1" -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{/* The probes and the container securityContext every component shares. */}}
{{- define "reamer.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end -}}

{{- define "reamer.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}
