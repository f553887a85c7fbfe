{{/* Names and labels (the Kubernetes recommended set). */}}
{{- define "tidegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tidegate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tidegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tidegate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tidegate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component: "tidegate.componentLabels" (dict "ctx" $ "component" "gateway"). */}}
{{- define "tidegate.componentLabels" -}}
{{ include "tidegate.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tidegate.componentSelector" -}}
{{ include "tidegate.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tidegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tidegate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tidegate.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "tidegate.secretName" -}}
{{- default (include "tidegate.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{/* The data folder inside the containers (the data volume's mount path). */}}
{{- define "tidegate.dataDir" -}}/var/lib/tidegate{{- end -}}

{{/* Where a Redis TLS CA certificate is mounted. */}}
{{- define "tidegate.redisCaDir" -}}/etc/tidegate/redis-tls{{- end -}}

{{/* Where spark-defaults.conf is mounted (SPARK_CONF_DIR). */}}
{{- define "tidegate.sparkConfDir" -}}/etc/tidegate/spark{{- end -}}

{{/*
The credentials and where each comes from: a list of [env name, Secret key, chart value].
With existingSecret the Secret key is the one named in existingSecretKeys (empty: absent);
with the chart's Secret an item is present when its value is set (or generated).
*/}}
{{- define "tidegate.secretItems" -}}
{{- $v := .Values -}}
{{- $k := $v.existingSecretKeys -}}
{{- $items := list -}}
{{- $items = append $items (list "TIDEGATE_AUTH__OPERATOR_KEY" "operator-key" $k.operatorKey "generate") -}}
{{- $items = append $items (list "TIDEGATE_SERVER__METRICS_TOKEN" "metrics-token" $k.metricsToken "generate") -}}
{{- $items = append $items (list "TIDEGATE_METADATA__URL" "metadata-url" $k.metadataUrl $v.metadata.url) -}}
{{- if eq $v.cold.catalog.type "sql" -}}
{{- $items = append $items (list "TIDEGATE_COLD__CATALOG__URI" "catalog-uri" (default $k.metadataUrl $k.catalogUri) (default $v.metadata.url $v.cold.catalog.uri)) -}}
{{- else -}}
{{- $items = append $items (list "TIDEGATE_COLD__CATALOG__CREDENTIAL" "catalog-credential" $k.catalogCredential $v.cold.catalog.credential) -}}
{{- end -}}
{{- if eq $v.hot.type "redis" -}}
{{- $items = append $items (list "TIDEGATE_HOT__URL" "redis-url" $k.redisUrl (include "tidegate.redisUrl" .)) -}}
{{- $items = append $items (list "TIDEGATE_HOT__SHARDS" "redis-shards" $k.redisShards (ternary (toJson $v.hot.redis.shards) "" (not (empty $v.hot.redis.shards)))) -}}
{{- end -}}
{{- $items = append $items (list "TIDEGATE_COLD__S3__ACCESS_KEY_ID" "s3-access-key-id" $k.s3AccessKeyId $v.cold.s3.accessKeyId) -}}
{{- $items = append $items (list "TIDEGATE_COLD__S3__SECRET_ACCESS_KEY" "s3-secret-access-key" $k.s3SecretAccessKey $v.cold.s3.secretAccessKey) -}}
{{- $present := list -}}
{{- range $items -}}
{{- if $v.existingSecret -}}
{{- if index . 2 -}}{{- $present = append $present (list (index . 0) (index . 2) (index . 3)) -}}{{- end -}}
{{- else if index . 3 -}}
{{- $present = append $present (list (index . 0) (index . 1) (index . 3)) -}}
{{- end -}}
{{- end -}}
{{- toJson $present -}}
{{- end -}}

{{/* The Redis URL with its password (URL-encoded) and the TLS CA file, for the Secret. */}}
{{- define "tidegate.redisUrl" -}}
{{- $r := .Values.hot.redis -}}
{{- if $r.url -}}
{{- $u := urlParse $r.url -}}
{{- $userinfo := $u.userinfo -}}
{{- /* Query escaping writes a space as "+", which userinfo would keep literally. */ -}}
{{- if $r.password -}}{{- $userinfo = printf ":%s" (urlquery $r.password | replace "+" "%20") -}}{{- end -}}
{{- $query := $u.query -}}
{{- if $r.tls.caSecret -}}
{{- $ca := printf "ssl_ca_certs=%s/%s" (include "tidegate.redisCaDir" .) $r.tls.caKey -}}
{{- $query = ternary $ca (printf "%s&%s" $query $ca) (empty $query) -}}
{{- end -}}
{{- urlJoin (dict "scheme" $u.scheme "userinfo" $userinfo "host" $u.host "path" $u.path "query" $query) -}}
{{- end -}}
{{- end -}}

{{/* Is the metadata store outside the pod (PostgreSQL...)? "true" or "". */}}
{{- define "tidegate.externalMetadata" -}}
{{- if or (and .Values.existingSecret .Values.existingSecretKeys.metadataUrl) (and (not .Values.existingSecret) .Values.metadata.url) -}}true{{- end -}}
{{- end -}}

{{/* Are the Spark jobs scheduled as CronJobs? "true" or "". */}}
{{- define "tidegate.tieringJob" -}}
{{- include "tidegate.cronJob" (dict "ctx" . "name" "tiering") -}}
{{- end -}}

{{/* Is the lake job "name" (tiering, compaction, expiry, orphans, retention) a CronJob? "true" or "". */}}
{{- define "tidegate.cronJob" -}}
{{- $v := .ctx.Values -}}
{{- if and (index $v.jobs .name).enabled (eq $v.hot.type "redis") $v.cold.enabled -}}true{{- end -}}
{{- end -}}

{{/* Does a lake CronJob run Spark (it then mounts the spark-defaults ConfigMap)? "true" or "". */}}
{{- define "tidegate.sparkJobs" -}}
{{- $ctx := . -}}
{{- range $name := list "tiering" "compaction" "rebalance" -}}
{{- if and (include "tidegate.cronJob" (dict "ctx" $ctx "name" $name)) (eq (index $ctx.Values.jobs $name).runner "spark") -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Checks values.schema.json cannot express: what several gateway replicas must share.
*/}}
{{- define "tidegate.validate" -}}
{{- $v := .Values -}}
{{- if eq $v.hot.type "redis" -}}
{{- if and (not $v.existingSecret) (not $v.hot.redis.url) (empty $v.hot.redis.shards) -}}
{{- fail "hot.redis.url is required with hot.type=redis (e.g. redis://redis-master:6379/0), or hot.redis.shards" -}}
{{- end -}}
{{- if and $v.existingSecret (not $v.existingSecretKeys.redisUrl) (not $v.existingSecretKeys.redisShards) -}}
{{- fail (printf "existingSecretKeys.redisUrl must name the key of Secret %s that holds the Redis URL (hot.type=redis)" $v.existingSecret) -}}
{{- end -}}
{{- if not (include "tidegate.externalMetadata" .) -}}
{{- fail "hot.type=redis needs a metadata store every replica shares: set metadata.url (or existingSecretKeys.metadataUrl), e.g. postgresql+psycopg://tidegate:PASSWORD@postgresql:5432/tidegate" -}}
{{- end -}}
{{- if and $v.cold.enabled (not (contains "://" $v.cold.warehouse)) -}}
{{- fail (printf "hot.type=redis needs a warehouse every replica shares: cold.warehouse %q must be s3://bucket/prefix" $v.cold.warehouse) -}}
{{- end -}}
{{- if and $v.cold.enabled (eq $v.cold.catalog.type "rest") (not $v.cold.catalog.uri) -}}
{{- fail "cold.catalog.uri (the REST catalog's base URL) is required with cold.catalog.type=rest" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The non-secret TIDEGATE_* settings (the ConfigMap's data), as YAML. */}}
{{- define "tidegate.settings" -}}
{{- $v := .Values -}}
{{- $s := dict -}}
{{- $_ := set $s "TIDEGATE_DATA_DIR" (include "tidegate.dataDir" .) -}}
{{- $_ = set $s "TIDEGATE_SERVER__HOST" "0.0.0.0" -}}
{{- $_ = set $s "TIDEGATE_SERVER__GRPC_PORT" (toString (int64 $v.server.grpcPort)) -}}
{{- $_ = set $s "TIDEGATE_SERVER__HTTP_PORT" (toString (int64 $v.server.httpPort)) -}}
{{- $_ = set $s "TIDEGATE_SERVER__METRICS_PORT" (toString (int64 $v.metrics.port)) -}}
{{- $_ = set $s "TIDEGATE_KAFKA__PORT" (toString (int64 $v.server.kafkaPort)) -}}
{{- /* Each pod is a Kafka broker at its own address (its IP, set in the Deployment from the
downward API) unless kafka.advertisedHost names one address for all: then the replicas
are no Kafka cluster, each answering as the one broker there (docs/kafka.md). */ -}}
{{- if $v.kafka.advertisedHost -}}
{{- $_ = set $s "TIDEGATE_KAFKA__ADVERTISED_HOST" $v.kafka.advertisedHost -}}
{{- $_ = set $s "TIDEGATE_KAFKA__ADVERTISED_PORT" (toString (int64 ($v.kafka.advertisedPort | default $v.service.kafkaPort))) -}}
{{- $_ = set $s "TIDEGATE_KAFKA__CLUSTER" "off" -}}
{{- else -}}
{{- $_ = set $s "TIDEGATE_KAFKA__ADVERTISED_PORT" (toString (int64 ($v.kafka.advertisedPort | default $v.server.kafkaPort))) -}}
{{- end -}}
{{- $_ = set $s "TIDEGATE_SERVER__MAX_REQUEST_BYTES" (toString (int64 $v.server.maxRequestBytes)) -}}
{{- $_ = set $s "TIDEGATE_SERVER__SHUTDOWN_GRACE_S" (toString $v.server.shutdownGraceS) -}}
{{- $_ = set $s "TIDEGATE_AUTH__KEY_CACHE_TTL_S" (toString $v.auth.keyCacheTtlS) -}}
{{- $_ = set $s "TIDEGATE_HOT__TYPE" $v.hot.type -}}
{{- if eq $v.hot.type "disk" -}}
{{- $_ = set $s "TIDEGATE_HOT__FSYNC" $v.hot.disk.fsync -}}
{{- $_ = set $s "TIDEGATE_HOT__FSYNC_INTERVAL_MS" (toString (int64 $v.hot.disk.fsyncIntervalMs)) -}}
{{- else -}}
{{- $_ = set $s "TIDEGATE_HOT__SOCKET_TIMEOUT_S" (toString $v.hot.redis.socketTimeoutS) -}}
{{- end -}}
{{- $_ = set $s "TIDEGATE_COLD__ENABLED" (toString $v.cold.enabled) -}}
{{- if $v.cold.enabled -}}
{{- $_ = set $s "TIDEGATE_COLD__CATALOG__TYPE" $v.cold.catalog.type -}}
{{- $_ = set $s "TIDEGATE_COLD__CATALOG__NAME" $v.cold.catalog.name -}}
{{- if eq $v.cold.catalog.type "rest" -}}
{{- $_ = set $s "TIDEGATE_COLD__CATALOG__URI" $v.cold.catalog.uri -}}
{{- if $v.cold.catalog.properties -}}
{{- $_ = set $s "TIDEGATE_COLD__CATALOG__PROPERTIES" (toJson $v.cold.catalog.properties) -}}
{{- end -}}
{{- end -}}
{{- if $v.cold.warehouse -}}
{{- $_ = set $s "TIDEGATE_COLD__WAREHOUSE" $v.cold.warehouse -}}
{{- end -}}
{{- if $v.cold.s3.endpoint -}}
{{- $_ = set $s "TIDEGATE_COLD__S3__ENDPOINT" $v.cold.s3.endpoint -}}
{{- end -}}
{{- $_ = set $s "TIDEGATE_COLD__S3__REGION" $v.cold.s3.region -}}
{{- $_ = set $s "TIDEGATE_COLD__S3__PATH_STYLE" (toString $v.cold.s3.pathStyle) -}}
{{- $_ = set $s "TIDEGATE_COLD__PRESIGN_EXPIRY_S" (toString (int64 $v.cold.presignExpiryS)) -}}
{{- $rc := $v.cold.restCatalog -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__ENABLED" (toString $rc.enabled) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__TOKEN_TTL_S" (toString (int64 $rc.tokenTtlS)) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__CREDENTIALS_DURATION_S" (toString (int64 $rc.credentialsDurationS)) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__SCAN_PLANNING" (toString $rc.scanPlanning) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__PLAN_MAX_HOT_RECORDS" (toString (int64 $rc.planMaxHotRecords)) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__PLAN_HOT_OVERFLOW" $rc.planHotOverflow -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__PLAN_PAGE_FILES" (toString (int64 $rc.planPageFiles)) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__PLAN_HOT_BYTES_PER_S" (toString (int64 $rc.planHotBytesPerS)) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__PLAN_SUBMIT_RECORDS" (toString (int64 $rc.planSubmitRecords)) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__PLAN_SUBMIT_GRACE_S" (toString $rc.planSubmitGraceS) -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__CLIENT_PLANNING_TABLES" (toJson (default (list) $rc.clientPlanningTables)) -}}
{{- if $rc.roleArn -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__ROLE_ARN" $rc.roleArn -}}
{{- end -}}
{{- if $rc.stsEndpoint -}}
{{- $_ = set $s "TIDEGATE_COLD__REST_CATALOG__STS_ENDPOINT" $rc.stsEndpoint -}}
{{- end -}}
{{- end -}}
{{- $_ = set $s "TIDEGATE_TIERING__ENABLED" (ternary "false" "true" (eq (include "tidegate.tieringJob" .) "true")) -}}
{{- $_ = set $s "TIDEGATE_TIERING__INTERVAL_S" (toString $v.tiering.intervalS) -}}
{{- $_ = set $s "TIDEGATE_TIERING__HOT_RETENTION_S" (toString $v.tiering.hotRetentionS) -}}
{{- $_ = set $s "TIDEGATE_TIERING__TARGET_FILE_BYTES" (toString (int64 $v.tiering.targetFileBytes)) -}}
{{- $_ = set $s "TIDEGATE_COMPACTION__ENABLED" (ternary "false" "true" (eq (include "tidegate.cronJob" (dict "ctx" . "name" "compaction")) "true")) -}}
{{- $_ = set $s "TIDEGATE_EXPIRY__ENABLED" (ternary "false" "true" (eq (include "tidegate.cronJob" (dict "ctx" . "name" "expiry")) "true")) -}}
{{- $_ = set $s "TIDEGATE_RETENTION__ENABLED" (ternary "false" "true" (eq (include "tidegate.cronJob" (dict "ctx" . "name" "retention")) "true")) -}}
{{- $secretNames := list -}}
{{- range (include "tidegate.secretItems" . | fromJsonArray) -}}{{- $secretNames = append $secretNames (index . 0) -}}{{- end -}}
{{- range $name, $value := $v.settings -}}
{{- if hasKey $s $name -}}
{{- fail (printf "settings.%s is set by the chart from its values: change the value that sets it instead (see values.yaml)" $name) -}}
{{- end -}}
{{- if has $name $secretNames -}}
{{- fail (printf "settings.%s is a credential: it goes in the Secret (see values.yaml)" $name) -}}
{{- end -}}
{{- $_ = set $s $name $value -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

{{/*
The env entries of every Tidegate container: HOME, the credentials, extraEnv.
"tidegate.env" (dict "ctx" $ "secret" <Secret name> "only" <env names, or empty: all>).
*/}}
{{- define "tidegate.env" -}}
- name: HOME
  value: /tmp
{{- range (include "tidegate.secretItems" .ctx | fromJsonArray) }}
{{- if or (not $.only) (has (index . 0) $.only) }}
- name: {{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ $.secret }}
      key: {{ index . 1 }}
{{- end }}
{{- end }}
{{- with .ctx.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
