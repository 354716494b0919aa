{{/*
membrane.validate fails the render on values that cannot work, naming
the value and what to do. Every template includes it, so `helm install`,
`helm template` and the Go SDK refuse the same values.
*/}}
{{- define "membrane.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.routingMode (list "tunnel" "native")) -}}
{{- fail (printf "routingMode %q: want tunnel or native" (toString $v.routingMode)) -}}
{{- end -}}
{{- if not (has $v.ipam.mode (list "kubernetes" "static")) -}}
{{- fail (printf "ipam.mode %q: want kubernetes (the Nodes' spec.podCIDRs) or static (ipam.ipv4Range/ipv6Range)" (toString $v.ipam.mode)) -}}
{{- end -}}
{{- if and (eq $v.ipam.mode "static") (not $v.ipam.ipv4Range) (not $v.ipam.ipv6Range) -}}
{{- fail "ipam.mode static needs ipam.ipv4Range or ipam.ipv6Range" -}}
{{- end -}}
{{- if and (eq $v.ipam.mode "kubernetes") (or $v.ipam.ipv4Range $v.ipam.ipv6Range) -}}
{{- fail "ipam.ipv4Range/ipv6Range are for ipam.mode static; ipam.mode kubernetes takes each node's spec.podCIDRs" -}}
{{- end -}}
{{- if not (has $v.identityAllocationMode (list "crd" "kvstore" "local")) -}}
{{- fail (printf "identityAllocationMode %q: want crd, kvstore or local" (toString $v.identityAllocationMode)) -}}
{{- end -}}
{{- if and (eq $v.identityAllocationMode "kvstore") (not $v.kvstore.endpoints) -}}
{{- fail "identityAllocationMode kvstore needs kvstore.endpoints (etcd client URLs, e.g. [https://10.0.0.10:2379])" -}}
{{- end -}}
{{- if and (ne $v.identityAllocationMode "kvstore") (or $v.kvstore.endpoints $v.kvstore.tlsSecret) -}}
{{- fail (printf "kvstore.endpoints/tlsSecret are set but identityAllocationMode is %q: set identityAllocationMode kvstore" (toString $v.identityAllocationMode)) -}}
{{- end -}}
{{- range $v.kvstore.endpoints -}}
{{- if not (regexMatch "^https?://[^/]+$" .) -}}
{{- fail (printf "kvstore.endpoints: %q: want http://host:port or https://host:port" .) -}}
{{- end -}}
{{- if and $v.kvstore.tlsSecret (not (hasPrefix "https://" .)) -}}
{{- fail (printf "kvstore.endpoints: %q: kvstore.tlsSecret turns TLS on, every endpoint must be https://" .) -}}
{{- end -}}
{{- end -}}
{{- if and $v.kubeProxyReplacement (not $v.k8sServiceHost) -}}
{{- fail "kubeProxyReplacement needs k8sServiceHost and k8sServicePort (the API server's address): without kube-proxy nothing translates the kubernetes Service's ClusterIP before the agent runs" -}}
{{- end -}}
{{- if and $v.policySecretsNamespace.name (not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" $v.policySecretsNamespace.name)) -}}
{{- fail (printf "policySecretsNamespace.name %q: not a namespace name (a DNS label)" $v.policySecretsNamespace.name) -}}
{{- end -}}
{{- if eq $v.policySecretsNamespace.name .Release.Namespace -}}
{{- fail (printf "policySecretsNamespace.name %q is the release's namespace: give the policy secrets a namespace of their own (the agent may read every Secret there)" $v.policySecretsNamespace.name) -}}
{{- end -}}
{{- if not (has $v.hostPorts (list "auto" "bpf" "portmap" "none")) -}}
{{- fail (printf "hostPorts %q: want auto, bpf, portmap or none" (toString $v.hostPorts)) -}}
{{- end -}}
{{- if and (eq $v.hostPorts "bpf") (not $v.kubeProxyReplacement) -}}
{{- fail "hostPorts bpf needs kubeProxyReplacement: without it use portmap (the portmap plugin in cni.binPath)" -}}
{{- end -}}
{{- if and $v.devices (not $v.kubeProxyReplacement) -}}
{{- fail "devices is for kubeProxyReplacement: set kubeProxyReplacement true or remove devices" -}}
{{- end -}}
{{- $port := int $v.k8sServicePort -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "k8sServicePort %v: want 1..65535" $v.k8sServicePort) -}}
{{- end -}}
{{- $tport := int $v.tunnelPort -}}
{{- if or (lt $tport 1) (gt $tport 65535) -}}
{{- fail (printf "tunnelPort %v: want 1..65535" $v.tunnelPort) -}}
{{- end -}}
{{- if or (lt (int $v.tunnelMTU) 1280) (gt (int $v.tunnelMTU) 65485) -}}
{{- fail (printf "tunnelMTU %v: want 1280..65485" $v.tunnelMTU) -}}
{{- end -}}
{{- if or (lt (int $v.cni.mtu) 576) (gt (int $v.cni.mtu) 65535) -}}
{{- fail (printf "cni.mtu %v: want 576..65535" $v.cni.mtu) -}}
{{- end -}}
{{- if not $v.image.repository -}}
{{- fail "image.repository is empty" -}}
{{- end -}}
{{- if not $v.image.tag -}}
{{- fail "image.tag is empty" -}}
{{- end -}}
{{- if not (has $v.image.pullPolicy (list "Always" "IfNotPresent" "Never")) -}}
{{- fail (printf "image.pullPolicy %q: want Always, IfNotPresent or Never" (toString $v.image.pullPolicy)) -}}
{{- end -}}
{{- if not (has $v.logLevel (list "debug" "info" "warn" "error")) -}}
{{- fail (printf "logLevel %q: want debug, info, warn or error" (toString $v.logLevel)) -}}
{{- end -}}
{{- if not (has $v.logFormat (list "text" "json")) -}}
{{- fail (printf "logFormat %q: want text or json" (toString $v.logFormat)) -}}
{{- end -}}
{{- end -}}

{{/* membrane.hostPorts is install-cni's --host-ports ("" for none). */}}
{{- define "membrane.hostPorts" -}}
{{- $m := .Values.hostPorts -}}
{{- if eq $m "auto" -}}
{{- $m = ternary "bpf" "none" .Values.kubeProxyReplacement -}}
{{- end -}}
{{- if ne $m "none" -}}{{ $m }}{{- end -}}
{{- end -}}

{{/* membrane.image is the image reference. */}}
{{- define "membrane.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* membrane.apiServer is --k8s-api-server's value ("" when unset). */}}
{{- define "membrane.apiServer" -}}
{{- with .Values.k8sServiceHost -}}
{{- if contains ":" . -}}
https://[{{ . }}]:{{ int $.Values.k8sServicePort }}
{{- else -}}
https://{{ . }}:{{ int $.Values.k8sServicePort }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
membrane.flags is the agent's configurable flags, name -> value: the
ConfigMap's data and the agent's --<name>=$(MEMBRANE_<NAME>) arguments.
*/}}
{{- define "membrane.flags" -}}
{{- $v := .Values -}}
datapath: linux
ipam: {{ $v.ipam.mode | quote }}
{{- if eq $v.ipam.mode "static" }}
ipv4-range: {{ $v.ipam.ipv4Range | quote }}
ipv6-range: {{ $v.ipam.ipv6Range | quote }}
{{- end }}
routing: {{ $v.routingMode | quote }}
tunnel-port: {{ int $v.tunnelPort | quote }}
tunnel-mtu: {{ int $v.tunnelMTU | quote }}
masquerade: {{ $v.masquerade | toString | quote }}
cluster-cidr: {{ join "," $v.clusterCIDRs | quote }}
kube-proxy-replacement: {{ $v.kubeProxyReplacement | toString | quote }}
{{- if $v.kubeProxyReplacement }}
devices: {{ join "," $v.devices | quote }}
socket-lb-cgroup: /run/membrane/cgroupv2
{{- end }}
l7-proxy: {{ ternary "/usr/local/bin/membrane-proxy" "" $v.l7Proxy | quote }}
dns-proxy: {{ $v.dnsProxy | toString | quote }}
policy-api-groups: {{ join "," $v.policyAPIGroups | quote }}
{{- if eq $v.identityAllocationMode "kvstore" }}
kvstore: etcd
etcd-endpoints: {{ join "," $v.kvstore.endpoints | quote }}
{{- else }}
identity-allocation-mode: {{ $v.identityAllocationMode | quote }}
identity-lease-namespace: {{ $v.identityLeaseNamespace | quote }}
{{- end }}
policy-secrets-namespace: {{ $v.policySecretsNamespace.name | quote }}
log-level: {{ $v.logLevel | quote }}
log-format: {{ $v.logFormat | quote }}
k8s-sync-timeout: 2m
k8s-pod-wait: 10s
k8s-probe-interval: 5s
k8s-pod-cidr-wait: 2m
k8s-api-server: {{ include "membrane.apiServer" . | quote }}
gc-interval: 1m
enable-health: "true"
{{- end -}}

{{/* membrane.envName is the environment variable of flag name. */}}
{{- define "membrane.envName" -}}
MEMBRANE_{{ . | upper | replace "-" "_" }}
{{- end -}}
