{{/* The release's name for objects: <release>-iop, or <release> when it already names iop. */}}
{{- define "iop.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "iop.edge" -}}{{ include "iop.fullname" . }}-edge{{- end -}}
{{- define "iop.node" -}}{{ include "iop.fullname" . }}-node{{- end -}}
{{/* The headless Service of the edges: their node endpoint (every address an edge, ready or not) and, with cluster, their admission service. */}}
{{- define "iop.edgeHeadless" -}}{{ include "iop.fullname" . }}-edge-headless{{- end -}}

{{- define "iop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component (edge or node): pass (list $ "edge"). */}}
{{- define "iop.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "iop.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The Secret holding keys.yaml, node-token and postgres-dsn. */}}
{{- define "iop.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "iop.fullname" .)) -}}
{{- end -}}

{{/* The edges' node endpoint as the nodes dial it. */}}
{{- define "iop.edgeAddress" -}}
{{- printf "%s.%s.svc.%s:%d" (include "iop.edgeHeadless" .) .Release.Namespace .Values.clusterDomain (int .Values.edge.service.nodePort) -}}
{{- end -}}

{{/* Fails the render on values that cannot make a working deployment (values.schema.json refuses unknown keys and wrong types). */}}
{{- define "iop.validate" -}}
{{- $s := .Values.secrets -}}
{{- if not $s.existingSecret -}}
{{- if and (not $s.keys) (not .Values.edge.insecureOpen) -}}
{{- fail "iop: set secrets.keys (the lines `iop keys create NAME` prints), or secrets.existingSecret (a Secret with keys.yaml and node-token), or edge.insecureOpen=true for an open API" -}}
{{- end -}}
{{- if not $s.nodeToken -}}
{{- fail "iop: set secrets.nodeToken (the join token the nodes present to the edge), or secrets.existingSecret" -}}
{{- end -}}
{{- if and .Values.postgres.enabled (not $s.postgresDSN) -}}
{{- fail "iop: postgres.enabled needs secrets.postgresDSN (postgres://USER:PASSWORD@HOST:5432/DB?sslmode=verify-full), or secrets.existingSecret with postgres-dsn" -}}
{{- end -}}
{{- end -}}
{{- if .Values.cluster.enabled -}}
{{- if not .Values.cluster.etcd -}}
{{- fail "iop: cluster.enabled needs cluster.etcd, the etcd client endpoints (http://etcd:2379)" -}}
{{- end -}}
{{- if and (not .Values.cluster.id) (not .Values.cluster.token) -}}
{{- fail "iop: cluster.enabled needs cluster.id (this deployment's name on etcd) or cluster.token" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* One edge's config file; pass (dict "root" $ "name" NAME) where NAME is the edge's pod name with cluster, else "". */}}
{{- define "iop.edgeConfig" -}}
{{- $ := .root -}}
{{- $c := deepCopy $.Values.edge.config -}}
{{- $_ := set $c "listen" (printf "0.0.0.0:%d" (int $.Values.edge.service.httpPort)) -}}
{{- $_ := set $c "node_listen" (printf "0.0.0.0:%d" (int $.Values.edge.service.nodePort)) -}}
{{- $_ := set $c "database" "/var/lib/iop/edge.db" -}}
{{- if or $.Values.secrets.existingSecret $.Values.secrets.keys -}}
{{- $_ := set $c "keys_file" "/etc/iop/secret/keys.yaml" -}}
{{- end -}}
{{- if $.Values.edge.insecureOpen -}}
{{- $_ := set $c "insecure_open" true -}}
{{- end -}}
{{- if .name -}}
{{- $cl := dict "etcd" $.Values.cluster.etcd "name" .name "advertise" (printf "%s.%s.%s.svc.%s:%d" .name (include "iop.edgeHeadless" $) $.Release.Namespace $.Values.clusterDomain (int $.Values.cluster.port)) "listen" (printf "0.0.0.0:%d" (int $.Values.cluster.port)) -}}
{{- with $.Values.cluster.id }}{{ $_ := set $cl "id" . }}{{ end -}}
{{- with $.Values.cluster.token }}{{ $_ := set $cl "token" . }}{{ end -}}
{{- with $.Values.cluster.sessionTTL }}{{ $_ := set $cl "session_ttl" . }}{{ end -}}
{{- with $.Values.cluster.prefix }}{{ $_ := set $cl "prefix" . }}{{ end -}}
{{- $_ := set $c "cluster" (merge $cl (deepCopy $.Values.cluster.config)) -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{- define "iop.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "iop.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}
