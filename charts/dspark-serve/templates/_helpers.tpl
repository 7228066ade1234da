{{/* Names ------------------------------------------------------------------------------ */}}

{{- define "dspark.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dspark.fullname" -}}
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

{{/* KubeRay derives `<cluster>-head-svc` and `<cluster>-<group>-worker-<hash>` pod names from
     the RayCluster's name, so it is kept short enough for those to stay within 63 characters. */}}
{{- define "dspark.rayClusterName" -}}
{{- include "dspark.fullname" . | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* `<fullname>-<suffix>` within 63 characters, the suffix kept whole:
     `include "dspark.suffixedName" (list $ "gateway")` */}}
{{- define "dspark.suffixedName" -}}
{{- $suffix := index . 1 }}
{{- $prefix := include "dspark.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix $suffix }}
{{- end }}

{{- define "dspark.gatewayName" -}}
{{- include "dspark.suffixedName" (list . "gateway") }}
{{- end }}

{{- define "dspark.plannerName" -}}
{{- include "dspark.suffixedName" (list . "planner") }}
{{- end }}

{{- define "dspark.serviceAccountName" -}}
{{- default (include "dspark.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "dspark.plannerServiceAccountName" -}}
{{- default (include "dspark.plannerName" .) .Values.planner.serviceAccount.name }}
{{- end }}

{{/* One image for every role; its flavor (rocm, cuda, cpu) follows the accelerator. */}}
{{- define "dspark.image" -}}
{{- $vendor := include "dspark.vendor" . | fromYaml }}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $vendor.imageFlavor) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* Labels: `include "dspark.labels" (list $ "gateway")` */}}
{{- define "dspark.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "dspark.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "dspark.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dspark.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: dspark-serve
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
{{- end }}

{{/* Accelerator and worker groups ------------------------------------------------------ */}}

{{/* The selected vendor's entry of accelerator.vendors, as YAML. */}}
{{- define "dspark.vendor" -}}
{{- $vendor := get .Values.accelerator.vendors .Values.accelerator.type }}
{{- if not $vendor }}
{{- fail (printf "accelerator.type %q is not a key of accelerator.vendors (%s)" .Values.accelerator.type (keys .Values.accelerator.vendors | sortAlpha | join ", ")) }}
{{- end }}
{{- toYaml $vendor }}
{{- end }}

{{/* One worker group's settings as YAML: workers.defaults overlaid with workers.<role> (maps
     merge key by key, everything else replaces), plus the resolved gpusPerPod, tpSize,
     enginesPerPod and resourceName. Call: `include "dspark.workerConfig" (list $ "prefill")`.
     The overlay is done key by key with `set` rather than mergeOverwrite, which would ignore
     zero values such as `minReplicas: 0`. */}}
{{- define "dspark.workerConfig" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- $cfg := deepCopy $root.Values.workers.defaults }}
{{- range $key, $value := (get $root.Values.workers $role | default dict) }}
{{- $base := get $cfg $key }}
{{- if and (kindIs "map" $value) (kindIs "map" $base) }}
{{- $_ := set $cfg $key (mergeOverwrite (deepCopy $base) $value) }}
{{- else }}
{{- $_ := set $cfg $key $value }}
{{- end }}
{{- end }}
{{- $vendor := include "dspark.vendor" $root | fromYaml }}
{{- $gpus := int (hasKey $cfg "gpusPerPod" | ternary (get $cfg "gpusPerPod") $vendor.gpusPerNode) }}
{{- if and (gt $gpus 0) (not $vendor.resourceName) }}
{{- fail (printf "workers.%s: gpusPerPod is %d but accelerator %q has no resourceName" $role $gpus $root.Values.accelerator.type) }}
{{- end }}
{{- $tp := int (hasKey $cfg "tpSize" | ternary (get $cfg "tpSize") (max $gpus 1)) }}
{{- if lt $tp 1 }}
{{- fail (printf "workers.%s.tpSize must be >= 1" $role) }}
{{- end }}
{{- if and (gt $gpus 0) (ne (mod $gpus $tp) 0) }}
{{- fail (printf "workers.%s: tpSize %d does not divide gpusPerPod %d" $role $tp $gpus) }}
{{- end }}
{{- if and (eq $gpus 0) (gt $tp 1) }}
{{- fail (printf "workers.%s: tpSize %d needs GPUs (gpusPerPod is 0)" $role $tp) }}
{{- end }}
{{- $minR := int $cfg.minReplicas }}
{{- $maxR := int $cfg.maxReplicas }}
{{- $replicas := int $cfg.replicas }}
{{- if or (gt $minR $maxR) (lt $replicas $minR) (gt $replicas $maxR) }}
{{- fail (printf "workers.%s: need minReplicas <= replicas <= maxReplicas (got %d, %d, %d)" $role $minR $replicas $maxR) }}
{{- end }}
{{- $_ := set $cfg "gpusPerPod" $gpus }}
{{- $_ := set $cfg "tpSize" $tp }}
{{- $_ := set $cfg "enginesPerPod" (ternary (div $gpus $tp) 1 (gt $gpus 0)) }}
{{- $_ := set $cfg "resourceName" $vendor.resourceName }}
{{- toYaml $cfg }}
{{- end }}

{{/* Model -------------------------------------------------------------------------------- */}}

{{- define "dspark.modelPath" -}}
{{- if eq .Values.model.source "none" }}
{{- required "model.name is required when model.source is none" .Values.model.name }}
{{- else if .Values.model.path }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.path) }}
{{- else }}
{{- .Values.model.mountPath }}
{{- end }}
{{- end }}

{{- define "dspark.modelVolume" -}}
{{- $m := .Values.model }}
{{- if eq $m.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required when model.source is pvc" $m.pvc.claimName }}
    readOnly: true
{{- else if eq $m.source "hostPath" }}
- name: model
  hostPath:
    path: {{ required "model.hostPath.path is required when model.source is hostPath" $m.hostPath.path }}
    type: {{ $m.hostPath.type }}
{{- else if eq $m.source "image" }}
- name: model
  image:
    reference: {{ required "model.image.reference is required when model.source is image" $m.image.reference }}
    pullPolicy: {{ $m.image.pullPolicy }}
{{- else if ne $m.source "none" }}
{{- fail (printf "model.source must be pvc, hostPath, image or none (got %q)" $m.source) }}
{{- end }}
{{- end }}

{{- define "dspark.modelVolumeMount" -}}
{{- if ne .Values.model.source "none" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Worker env of speculative decoding and of the GPU check, as `dspark-serve worker` options:
     `include "dspark.workerEngineEnv" (list $ $cfg)` with $cfg from dspark.workerConfig. YAML
     1.1 reads an unquoted `on`/`off` as a boolean, so booleans stand for those two modes. */}}
{{- define "dspark.workerEngineEnv" -}}
{{- $root := index . 0 }}
{{- $cfg := index . 1 }}
{{- $spec := $root.Values.speculative }}
{{- $mode := $spec.mode }}
{{- if kindIs "bool" $mode }}
{{- $mode = ternary "on" "off" $mode }}
{{- end }}
- name: DSPARK_SPECULATIVE
  value: {{ $mode | quote }}
{{- with $spec.drafter }}
- name: DSPARK_DRAFTER
  {{- if eq $root.Values.model.source "none" }}
  value: {{ . | quote }}
  {{- else }}
  value: {{ printf "%s/%s" (trimSuffix "/" $root.Values.model.mountPath) (trimPrefix "/" .) | quote }}
  {{- end }}
{{- end }}
{{- if hasKey $spec "gamma" }}
- name: DSPARK_GAMMA
  value: {{ $spec.gamma | quote }}
{{- end }}
{{- if hasKey $spec "maxBatchSize" }}
- name: DSPARK_SPECULATIVE_MAX_BATCH_SIZE
  value: {{ $spec.maxBatchSize | quote }}
{{- end }}
{{- if gt (int $cfg.gpusPerPod) 0 }}
- name: DSPARK_REQUIRE_GPUS
  value: {{ $cfg.gpusPerPod | quote }}
- name: DSPARK_GPU_RESOURCE
  value: {{ $cfg.resourceName | quote }}
{{- end }}
{{- end }}

{{/* Writable scratch: the root filesystem is read-only. */}}
{{- define "dspark.scratchVolumes" -}}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
{{- end }}

{{- define "dspark.scratchVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/dspark
{{- end }}

{{/* The workers' compiled-kernel cache (values `compileCache`). */}}
{{- define "dspark.compileCacheVolume" -}}
{{- $c := .Values.compileCache }}
- name: compile-cache
{{- if eq $c.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ required "compileCache.pvc.claimName is required when compileCache.source is pvc" $c.pvc.claimName }}
{{- else if eq $c.source "emptyDir" }}
  emptyDir: {{ if $c.sizeLimit }}{sizeLimit: {{ $c.sizeLimit }}}{{ else }}{}{{ end }}
{{- else }}
{{- fail (printf "compileCache.source must be emptyDir or pvc (got %q)" $c.source) }}
{{- end }}
{{- end }}

{{- define "dspark.compileCacheVolumeMount" -}}
- name: compile-cache
  mountPath: {{ .Values.compileCache.mountPath }}
{{- end }}

{{- define "dspark.compileCacheEnv" -}}
- name: TRITON_CACHE_DIR
  value: {{ printf "%s/triton" .Values.compileCache.mountPath | quote }}
{{- end }}

{{/* Shared memory: a RAM-backed emptyDir at /dev/shm of the given size. */}}
{{- define "dspark.shmVolume" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ . }}
{{- end }}

{{/* Probe timings from values, with the handler given by the template. */}}
{{- define "dspark.probeTimings" -}}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end }}

{{/* `ray start` parameters, as a YAML map of strings (the RayCluster schema's type). */}}
{{- define "dspark.rayStartParams" -}}
{{- $params := dict }}
{{- range $key, $value := . }}
{{- $_ := set $params $key (toString $value) }}
{{- end }}
{{- toYaml $params }}
{{- end }}

{{/* Env of every Ray node (head, workers, gateways): the Ray authentication token, if any. */}}
{{- define "dspark.rayAuthEnv" -}}
{{- with .Values.rayCluster.authToken.existingSecret }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.rayCluster.authToken.key }}
{{- end }}
{{- end }}

{{/* The node script's ConfigMap volume and its mount. */}}
{{- define "dspark.rayNodeVolume" -}}
- name: ray-node
  configMap:
    name: {{ include "dspark.suffixedName" (list . "ray-node") }}
    defaultMode: 0555
{{- end }}

{{- define "dspark.rayNodeVolumeMount" -}}
- name: ray-node
  mountPath: /opt/dspark
  readOnly: true
{{- end }}
