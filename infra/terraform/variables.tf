variable "project_id" {
  type        = string
  description = "Google Cloud project to deploy relaybus into."
}

variable "region" {
  type        = string
  description = "Region of the Cloud Run services, Eventarc triggers and Scheduler jobs."
  default     = "europe-west1"
}

variable "topology_file" {
  type        = string
  description = "Path of the topology file. Null means infra/topology.yaml, the file baked into the images; keep them the same."
  default     = null
}

variable "image_repository" {
  type        = string
  description = "Artifact Registry repository holding the images, e.g. europe-west1-docker.pkg.dev/PROJECT/relaybus. Each function's image is <repository>/<function>:<image_tag>."
}

variable "image_tag" {
  type        = string
  description = "Tag of the images to deploy (cloudbuild.yaml passes $COMMIT_SHA)."

  validation {
    condition     = length(var.image_tag) > 0 && var.image_tag != "latest"
    error_message = "image_tag must name one build (the commit SHA), not latest: a deploy must be repeatable."
  }
}

variable "image_overrides" {
  type        = map(string)
  description = "Full image references by function (publish, relay, consume, rollup, dlqreplay) that replace <image_repository>/<function>:<image_tag>."
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.image_overrides) : contains(["publish", "relay", "consume", "rollup", "dlqreplay"], k)])
    error_message = "image_overrides keys must be publish, relay, consume, rollup or dlqreplay."
  }
}

variable "database_url_secrets" {
  type        = map(string)
  description = "Databases of the topology that are not in Cloud SQL: topology database name => id of an existing Secret Manager secret (in project_id) whose latest version is that database's full Postgres URL, pool_max_conns included. Every other database is created in Cloud SQL (cloud_sql)."
  default     = {}
}

variable "cloud_sql" {
  type = object({
    create               = optional(bool, true)
    instance             = optional(string, "relaybus")
    region               = optional(string)
    database_version     = optional(string, "POSTGRES_16")
    tier                 = optional(string, "db-custom-2-7680")
    edition              = optional(string, "ENTERPRISE")
    availability_type    = optional(string, "ZONAL")
    disk_size_gb         = optional(number, 20)
    max_connections      = optional(number, 400)
    reserved_connections = optional(number, 20)
    pool_max_conns       = optional(number, 5)
  })
  description = "The Cloud SQL for PostgreSQL instance of the topology's databases (database.tf): create it (create = true) or use the existing instance named instance in project_id (create = false; set max_connections to its real limit). region defaults to var.region. pool_max_conns is each Cloud Run instance's pool per database (the URL's pool_max_conns); database.tf checks pool sizes × max instances against max_connections − reserved_connections. database_version is POSTGRES_16 by default: from 16 on, a CREATEROLE user administers only the roles it created (database.tf, \"Roles\"); to keep an instance created on POSTGRES_15 as it is, set POSTGRES_15 (a major version upgrade is a change to plan for: back up first)."
  default     = {}

  validation {
    condition     = var.cloud_sql.pool_max_conns >= 1 && var.cloud_sql.reserved_connections >= 3 && var.cloud_sql.max_connections > var.cloud_sql.reserved_connections
    error_message = "cloud_sql: pool_max_conns must be at least 1, reserved_connections at least 3 (PostgreSQL's superuser_reserved_connections), max_connections above reserved_connections."
  }
}

variable "firestore_database" {
  type        = string
  description = "Firestore database id of the ledger (FIRESTORE_DATABASE)."
  default     = "(default)"
}

variable "audit_firestore_database" {
  type        = string
  description = "Firestore database id of the operators' audit log (dlqreplay's FIRESTORE_AUDIT_DATABASE), created here: a database of its own, where only dlqreplay's identity may create and read entries and no identity may change or delete one (firestore.tf)."
  default     = "relaybus-audit"

  validation {
    condition     = var.audit_firestore_database != var.firestore_database && length(regexall("^[a-z][a-z0-9-]{2,61}[a-z0-9]$", var.audit_firestore_database)) > 0
    error_message = "audit_firestore_database must be a Firestore database id (4 to 63 characters of [a-z0-9-], starting with a letter) other than firestore_database: the audit log's grants are per database."
  }
}

variable "create_firestore_database" {
  type        = bool
  description = "Create the Firestore database. Set false when the project already has it (e.g. an existing (default) database); the indexes are created either way."
  default     = true
}

variable "firestore_location" {
  type        = string
  description = "Firestore location (a multi-region such as eur3 or nam5, or a region)."
  default     = "eur3"
}

variable "log_level" {
  type        = string
  description = "LOG_LEVEL of every function."
  default     = "info"

  validation {
    condition     = contains(["debug", "info", "warn", "error"], var.log_level)
    error_message = "log_level must be debug, info, warn or error."
  }
}

variable "ledger" {
  type        = string
  description = "LEDGER of publish, relay and consume: firestore, or off to run without the ledger."
  default     = "firestore"

  validation {
    condition     = contains(["firestore", "off"], var.ledger)
    error_message = "ledger must be firestore or off."
  }
}

variable "publish_settings" {
  type = object({
    fast_path         = optional(bool, true)
    max_payload_bytes = optional(number, 1048576)
    budget            = optional(string, "2s")
    max_in_flight     = optional(number, 256)
    ingress           = optional(string, "INGRESS_TRAFFIC_ALL")
    max_instances     = optional(number, 20)
    rate_limit        = optional(number, 200)
    rate_burst        = optional(number, 400)
  })
  description = "publish: PUBLISH_FAST_PATH, PUBLISH_MAX_PAYLOAD_BYTES, PUBLISH_BUDGET (a request never takes longer: past it the event is answered pending and left to the relay), PUBLISH_MAX_IN_FLIGHT (beyond it, 503 with Retry-After), PUBLISH_RATE_LIMIT and PUBLISH_RATE_BURST (each caller's requests per second and burst on one instance; beyond them, 429 with Retry-After; 0 turns the limit off), Cloud Run ingress (INGRESS_TRAFFIC_ALL with IAM, or INGRESS_TRAFFIC_INTERNAL_ONLY when producers reach it through a VPC) and max instances."
  default     = {}

  validation {
    condition     = var.publish_settings.rate_limit >= 0 && var.publish_settings.rate_burst >= 1
    error_message = "publish_settings: rate_limit at least 0 (0: no limit), rate_burst at least 1."
  }
}

variable "relay_settings" {
  type = object({
    batch_size       = optional(number, 1000)
    aggregates       = optional(number, 1000)
    run_limit        = optional(number, 500)
    workers          = optional(number, 4)
    lease            = optional(string, "20s")
    max_attempts     = optional(number, 5)
    backoff_base     = optional(string, "10s")
    backoff_max      = optional(string, "10m")
    heal_delay       = optional(string, "30s")
    outbox_retention = optional(string, "24h")
    max_instances    = optional(number, 3)
    concurrency      = optional(number, 1)
  })
  description = "relay (and publish's fast path): RELAY_BATCH_SIZE (rows per claim), RELAY_AGGREGATES (aggregates per claim), RELAY_RUN_LIMIT (rows of one aggregate per claim), RELAY_CONCURRENCY (workers per drain: workers), RELAY_HEAL_DELAY, RELAY_LEASE, RELAY_MAX_ATTEMPTS, RELAY_BACKOFF_BASE, RELAY_BACKOFF_MAX, OUTBOX_RETENTION; the relay service's max instances and per-instance concurrency (max_instances × concurrency must cover one drain per database per tick). RELAY_TIME_BUDGET comes from the topology (relay.time_budget_seconds)."
  default     = {}
}

variable "consume_settings" {
  type = object({
    inbox_retention = optional(string, "192h")
    max_instances   = optional(number, 10)
    concurrency     = optional(number, 40)
    flow_wait       = optional(string, "5s")
  })
  description = "Every consume service: INBOX_RETENTION; max instances and per-instance concurrency where the topology sets no max_instances or max_in_flight for the consumer (docs/consuming.md, Flow control); CONSUMER_FLOW_WAIT (flow_wait: how long a pushed delivery over its consumer's flow-control limits waits before a 429)."
  default     = {}
}

variable "rollup_settings" {
  type = object({
    concurrency   = optional(number, 80)
    max_instances = optional(number, 5)
    window        = optional(string, "5s")
    write_gap     = optional(string, "1s")
  })
  description = "rollup: per-instance request concurrency, max instances, ROLLUP_WINDOW (how long notices are gathered into one rollup) and ROLLUP_WRITE_GAP (the least time between two writes of one event document; Firestore sustains about one write per second per document). rollup coalesces the notices of concurrent requests into one ledger transaction per event, so it needs concurrency; /reconcile and /expire no longer hold the only request slot."
  default     = {}

  validation {
    condition     = var.rollup_settings.concurrency >= 2 && var.rollup_settings.concurrency <= 1000 && var.rollup_settings.max_instances >= 1
    error_message = "rollup_settings: concurrency 2 to 1000 (a single slot would queue notices behind /expire), max_instances at least 1."
  }
}

variable "dlqreplay_settings" {
  type = object({
    auth          = optional(string, "cloudrun")
    ingress       = optional(string, "INGRESS_TRAFFIC_ALL")
    writers       = optional(list(string), [])
    read_only     = optional(bool, false)
    token_secret  = optional(string)
    max_instances = optional(number, 2)
    audiences     = optional(list(string), [])
    rate_limit    = optional(number, 10)
    rate_burst    = optional(number, 40)
  })
  description = <<-EOT
    dlqreplay, the operations API:
      auth           DLQREPLAY_AUTH. cloudrun (production): Cloud Run IAM verifies the caller's
                     Google ID token (var.operators hold roles/run.invoker) and dlqreplay reads the
                     caller from the token's claims, checking their expiry and audience again;
                     iam: dlqreplay verifies the token itself (only where no platform verified it);
                     token: personal tokens from token_secret (a JSON object from each holder's
                     email to their token) in header X-Relaybus-Token (the DLQ monitors, whose push
                     cannot add a header, archive with their push OIDC token:
                     DLQREPLAY_ARCHIVERS); none: no check (local only).
      writers        DLQREPLAY_WRITERS: principals (emails) who are admins of everything, besides
                     var.operators; empty adds nobody.
      read_only      DLQREPLAY_READ_ONLY: refuse every change.
      token_secret   Secret Manager secret id holding DLQREPLAY_TOKEN (auth = token only).
      audiences      audiences DLQREPLAY_AUDIENCE accepts besides the service's deterministic URL
                     (output dlqreplay_url) and gcloud's client id (a user's default ID token).
      rate_limit     DLQREPLAY_RATE_LIMIT and DLQREPLAY_RATE_BURST: each caller's requests per
      rate_burst     second and burst on one instance; beyond them, 429 (0: no limit).
      ingress        Cloud Run ingress.
      max_instances  Cloud Run max instances.
  EOT
  default     = {}

  validation {
    condition     = contains(["cloudrun", "iam", "token", "none"], var.dlqreplay_settings.auth)
    error_message = "dlqreplay_settings.auth must be cloudrun, iam, token or none."
  }
  validation {
    condition     = var.dlqreplay_settings.auth != "token" || try(length(var.dlqreplay_settings.token_secret) > 0, false)
    error_message = "dlqreplay_settings.auth = token needs dlqreplay_settings.token_secret (the Secret Manager secret holding DLQREPLAY_TOKEN)."
  }
  validation {
    condition     = alltrue([for w in var.dlqreplay_settings.writers : !contains(["allUsers", "allAuthenticatedUsers", "*"], w)])
    error_message = "dlqreplay_settings.writers names principals (emails), never allUsers, allAuthenticatedUsers or *."
  }
  validation {
    condition     = var.dlqreplay_settings.rate_limit >= 0 && var.dlqreplay_settings.rate_burst >= 1
    error_message = "dlqreplay_settings: rate_limit at least 0 (0: no limit), rate_burst at least 1."
  }
}

variable "ledger_retention" {
  type        = string
  description = "LEDGER_RETENTION (Go duration) of every function: how long ledger documents live; the code writes deleteAt and Firestore's TTL policies (firestore.tf) delete them."
  default     = "720h"

  validation {
    condition     = length(regexall("^([0-9]+(h|m|s))+$", var.ledger_retention)) > 0
    error_message = "ledger_retention is a Go duration in hours, minutes and seconds, e.g. 720h."
  }
}

variable "archive_retention" {
  type        = string
  description = "ARCHIVE_RETENTION (Go duration) of dlqreplay: how long archived dead letters live (deleteAt, Firestore TTL)."
  default     = "720h"

  validation {
    condition     = length(regexall("^([0-9]+(h|m|s))+$", var.archive_retention)) > 0
    error_message = "archive_retention is a Go duration in hours, minutes and seconds, e.g. 720h."
  }
}

variable "shutdown_timeout" {
  type        = string
  description = "SHUTDOWN_TIMEOUT of every function: how long a SIGTERM'd instance drains in-flight work. Cloud Run kills the instance 10 s after SIGTERM (https://cloud.google.com/run/docs/container-contract#instance-shutdown), so keep it below 10s."
  default     = "8s"

  validation {
    condition     = length(regexall("^[0-9]s$", var.shutdown_timeout)) > 0
    error_message = "shutdown_timeout must be whole seconds below 10 (Cloud Run's SIGTERM grace), e.g. 8s."
  }
}

variable "always_allocated_cpu" {
  type        = bool
  description = "Instance-based billing (cpu_idle = false) for publish, relay and consume, which write the ledger in background goroutines after answering. With request-based billing Cloud Run throttles CPU outside requests and that work stalls until the next request (the Scheduler catch-up jobs still make the ledger converge)."
  default     = true
}

variable "schedules" {
  type = object({
    ledger_ship   = optional(string, "* * * * *")
    inbox_purge   = optional(string, "17 3 * * *")
    gaps_check    = optional(string, "* * * * *")
    breaker_probe = optional(string, "* * * * *")
    reconcile     = optional(string, "* * * * *")
    expire        = optional(string, "0 * * * *")
  })
  description = "Cron schedules of the Scheduler jobs besides the relay's (which is the topology's relay.schedule): each consume service's POST /ledger:ship and POST /inbox:purge, each strict consumer's POST /gaps:check, each forward push consumer's POST /breaker:probe, rollup's POST /reconcile and POST /expire."
  default     = {}
}

variable "propagation_waits" {
  type = object({
    api         = optional(string, "60s")
    iam         = optional(string, "120s")
    log_metrics = optional(string, "660s")
  })
  description = "Waits (time_sleep) for eventual consistency: after enabling APIs, after IAM grants (typically 2 minutes, https://cloud.google.com/iam/docs/access-change-propagation), and after creating log-based metrics before the alert policies that use them (Monitoring: a new metric \"could take up to 10 minutes to become available\", provider issue #11102; at least 600s). Each wait runs only when what it waits for is created or changed."
  default     = {}

  # Seconds only ("660s"), so the rule can be checked: Monitoring says a new
  # log-based metric may take up to 10 minutes to become available.
  validation {
    condition     = can(regex("^[0-9]+s$", var.propagation_waits.log_metrics)) && try(tonumber(trimsuffix(var.propagation_waits.log_metrics, "s")) >= 600, false)
    error_message = "propagation_waits.log_metrics must be whole seconds (e.g. \"660s\") and at least 600s: a new log-based metric may take up to 10 minutes to become visible to Monitoring, and an alert policy created before that fails with \"Cannot find metric(s)\"."
  }
}

variable "publish_invokers" {
  type        = list(string)
  description = "IAM members allowed to call publish (the producer services' service accounts, as serviceAccount:...)."
  default     = []

  validation {
    condition     = alltrue([for m in var.publish_invokers : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "publish is never public: allUsers and allAuthenticatedUsers are refused."
  }
}

variable "operators" {
  type = list(object({
    member    = string
    role      = string
    topics    = optional(list(string), [])
    consumers = optional(list(string), [])
  }))
  description = <<-EOT
    Who may use the operations API (dlqreplay), and for what: each entry grants a role to an IAM
    member (user:EMAIL, group:EMAIL or serviceAccount:EMAIL), on everything or on some topics and
    consumer services. viewer reads (payload reads are audited); operator also replays and deletes
    dead letters, re-pushes, seeks, pauses and resumes, skips gaps, enables and disables consumers;
    admin also adds consumers, disables a topic's last one and rebuilds projections. Each member is
    given roles/run.invoker on dlqreplay (Cloud Run admits its ID tokens) and dlqreplay reads the
    grants as DLQREPLAY_ROLES (docs/security.md). Required: with none, nobody may do anything.
  EOT

  validation {
    condition     = alltrue([for o in var.operators : length(regexall("^(user|group|serviceAccount):[^@:, ]+@[^@:, ]+$", o.member)) > 0 && contains(["viewer", "operator", "admin"], o.role)])
    error_message = "operators: each member is user:EMAIL, group:EMAIL or serviceAccount:EMAIL (dlqreplay is never public: allUsers and allAuthenticatedUsers are refused), each role viewer, operator or admin."
  }
}

variable "publishers" {
  type        = map(list(string))
  description = "Per topic, the service accounts (serviceAccount:EMAIL, or an email) that may publish to it through publish, besides the topology's publishers (PUBLISH_PUBLISHERS): a topic nobody is named for takes no HTTP publish at all. Each is given roles/run.invoker on publish. Required ({} when the topology names every publisher)."

  validation {
    condition     = alltrue(flatten([for t, ms in var.publishers : [for m in ms : length(regexall("^((serviceAccount|user):)?[^@:, ]+@[^@:, ]+$", m)) > 0]]))
    error_message = "publishers: each is an email (serviceAccount: or user: prefix allowed); groups, domains, allUsers and allAuthenticatedUsers cannot be checked against a caller's ID token."
  }
}

variable "scheduler_time_zone" {
  type        = string
  description = "Time zone of the Scheduler jobs' cron schedules."
  default     = "Etc/UTC"
}

variable "relaybus" {
  type        = string
  description = "relaybus's CLI (go install ./cmd/relaybus, or cloudbuild.deploy.yaml's build of it) on the machine applying Terraform: it syncs the topics' schema revisions (relaybus schemas sync) with the application default credentials."
  default     = "relaybus"
}

variable "gcloud" {
  type        = string
  description = "gcloud command the deploy steps run on the machine applying Terraform (Eventarc subscription policies, topic_consumers sync)."
  default     = "gcloud"
}

variable "alerts" {
  type = object({
    notification_channels       = optional(list(string), [])
    subscription_backlog        = optional(number, 1000)
    oldest_unacked_age_seconds  = optional(number, 300)
    dead_letters_per_hour       = optional(number, 10)
    archive_backlog_minutes     = optional(number, 10)
    outbox_backlog              = optional(number, 1000)
    publish_failures_per_minute = optional(number, 10)
  })
  description = "Alert thresholds (docs/telemetry.md) and the notification channels (ids) they notify."
  default     = {}
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the Cloud Run services and the Firestore database from terraform destroy."
  default     = true
}

variable "ledger_budget" {
  type        = string
  description = "LEDGER_BUDGET of publish, relay and consume (Go duration): how long one batch of ledger writes may take, in the background; what misses it is recorded later by the relay's healing step and consume's /ledger:ship."
  default     = "10s"
}

variable "pull_mode" {
  type = object({
    enabled               = optional(bool, false)
    consumers             = optional(list(string), [])
    min_instances         = optional(number, 1)
    max_instances         = optional(number, 1)
    max_in_flight         = optional(number)
    exactly_once_delivery = optional(bool, false)
  })
  description = "Pull mode (CONSUMER_MODE=pull, pull.tf), off by default: with enabled, the consumers listed by subscription id (every consumer when the list is empty) get a plain pull subscription instead of their push subscription or Eventarc trigger, and their consume service pulls it as a long-running worker: min_instances always-on instances (instance-based billing), at most max_instances (1 keeps each ordering key in one worker), PULL_MAX_IN_FLIGHT deliveries at once (max_in_flight; by default cloud_sql.pool_max_conns, and never more); exactly_once_delivery sets enable_exactly_once_delivery on their subscriptions (pull only)."
  default     = {}

  validation {
    condition = (var.pull_mode.min_instances >= 1 && var.pull_mode.max_instances >= var.pull_mode.min_instances &&
    (var.pull_mode.max_in_flight == null ? true : var.pull_mode.max_in_flight >= 1 && var.pull_mode.max_in_flight <= 1000))
    error_message = "pull_mode: min_instances at least 1 (a pull worker gets no request to start it), max_instances at least min_instances, max_in_flight 1 to 1000."
  }
}

variable "forwarders" {
  type = object({
    enabled       = optional(bool, false)
    database      = optional(string, "main")
    max_instances = optional(number, 5)
    concurrency   = optional(number, 40)
    key_secret    = optional(string, "")
  })
  description = "Forward consumers added at run time (forwarders.tf, docs/forwarding.md), off by default: with enabled, the forwarders consume service (CONSUMER_HANDLER=forwarders) serves every forwarder an operator adds through the operators' API, whose registry is in database (a topology database; dlqreplay's DLQREPLAY_FORWARDERS_DATABASE), on at most max_instances instances of concurrency requests each (its pools count against cloud_sql.max_connections), and dlqreplay may create and delete their subscriptions. On NATS (var.nats) the service pulls every forwarder's durable consumer (CONSUMER_MODE=pull) on exactly one always-on instance with CPU always allocated, whatever max_instances says, each forwarder's worker holding at most PULL_MAX_IN_FLIGHT deliveries (pull_mode.max_in_flight; by default cloud_sql.pool_max_conns, and never more); nothing pushes to it, so there is no push identity and dlqreplay gets no Pub/Sub grant. key_secret names a Secret Manager secret holding RELAYBUS_FORWARDERS_KEY (the standard base64 of 32 random bytes: openssl rand -base64 32), the key hmac forwarders' signing secrets are sealed under, which dlqreplay and the forwarders service read; empty, adding an hmac forwarder answers 501. Off, POST /forwarders answers 501."
  default     = {}

  validation {
    condition     = var.forwarders.max_instances >= 1 && var.forwarders.concurrency >= 1 && var.forwarders.concurrency <= 1000
    error_message = "forwarders: max_instances at least 1, concurrency 1 to 1000 (Cloud Run's limit)."
  }
}

variable "nats" {
  type = object({
    url                = string
    credentials_secret = optional(string, "")
    min_instances      = optional(number, 1)
  })
  description = "The NATS JetStream transport (nats.tf), off by default (Pub/Sub): url is the server's (nats:// or tls://, NATS_URL), credentials_secret a Secret Manager secret holding a NATS credentials file (NATS_CREDS; empty: none), min_instances the always-on instances of rollup and dlqreplay, which pull their deliveries."
  default     = null

  validation {
    condition     = var.nats == null ? true : (length(regexall("^(nats|tls)://[^/@\\s]+$", var.nats.url)) > 0 && var.nats.min_instances >= 1)
    error_message = "nats: url is nats://host:port or tls://host:port (no user or password in it: use credentials_secret), and min_instances at least 1 (a puller gets no request to start it)."
  }
}

variable "claim_check" {
  type = object({
    enabled         = optional(bool, true)
    bucket          = optional(string)
    threshold_bytes = optional(number, 1048576)
    retention_days  = optional(number)
  })
  description = "Claim check (claimcheck.tf, docs/producing.md \"Large payloads\"): a Cloud Storage bucket (default <project>-relaybus-claims) for message data over threshold_bytes (CLAIM_CHECK_THRESHOLD, default 1 MiB), deleted retention_days after it was written (default: the longest topic message retention, in days). enabled = false creates no bucket: an event whose message is over Pub/Sub's 10 MB then fails at its first publish."
  default     = {}

  validation {
    condition     = var.claim_check.threshold_bytes >= 1 && var.claim_check.threshold_bytes <= 10000000 && (var.claim_check.retention_days == null || try(var.claim_check.retention_days >= 1, false))
    error_message = "claim_check: threshold_bytes from 1 to 10000000 (Pub/Sub's message limit); retention_days at least 1."
  }
}

variable "privacy_key_secret" {
  type        = string
  description = "The Secret Manager secret holding PRIVACY_KEY (at least 16 bytes): the key the privacy rules' keyed hashes and the ledger's subject keys are made with (docs/privacy.md). Empty: the functions use the public development key, which hides nothing; set it before a topic declares a privacy rule."
  default     = ""
}
