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

variable "database_url_secret" {
  type        = string
  description = "Secret Manager secret id (in project_id) whose latest version is the producer-side Postgres URL (the outbox): publish, relay and dlqreplay read it as DATABASE_URL. Create it and add a version before the first apply."
}

variable "consumer_database_url_secrets" {
  type        = map(string)
  description = "Secret Manager secret id per consumer service (the topology's service) holding that consumer's Postgres URL (its inbox and projections). A consumer not listed uses database_url_secret."
  default     = {}
}

variable "firestore_database" {
  type        = string
  description = "Firestore database id of the ledger (FIRESTORE_DATABASE)."
  default     = "(default)"
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
    ingress           = optional(string, "INGRESS_TRAFFIC_ALL")
    max_instances     = optional(number, 20)
  })
  description = "publish: PUBLISH_FAST_PATH, PUBLISH_MAX_PAYLOAD_BYTES, Cloud Run ingress (INGRESS_TRAFFIC_ALL with IAM, or INGRESS_TRAFFIC_INTERNAL_ONLY when producers reach it through a VPC) and max instances."
  default     = {}
}

variable "relay_settings" {
  type = object({
    batch_size       = optional(number, 500)
    lease            = optional(string, "2m")
    max_attempts     = optional(number, 5)
    backoff_base     = optional(string, "10s")
    backoff_max      = optional(string, "10m")
    outbox_retention = optional(string, "24h")
    max_instances    = optional(number, 3)
  })
  description = "relay (and publish's fast path): RELAY_BATCH_SIZE, RELAY_LEASE, RELAY_MAX_ATTEMPTS, RELAY_BACKOFF_BASE, RELAY_BACKOFF_MAX, OUTBOX_RETENTION. RELAY_TIME_BUDGET comes from the topology (relay.time_budget_seconds)."
  default     = {}
}

variable "consume_settings" {
  type = object({
    inbox_retention = optional(string, "192h")
    max_instances   = optional(number, 10)
    concurrency     = optional(number, 40)
  })
  description = "Every consume service: INBOX_RETENTION, max instances and per-instance concurrency."
  default     = {}
}

variable "dlqreplay_settings" {
  type = object({
    auth         = optional(string, "iam")
    ingress      = optional(string, "INGRESS_TRAFFIC_ALL")
    archive_path = optional(string, "/deadletters:sync")
  })
  description = "dlqreplay: DLQREPLAY_AUTH (iam verifies the caller's Google ID token), Cloud Run ingress, and the path the archive Scheduler job POSTs to every minute (null: no archive job)."
  default     = {}

  validation {
    condition     = contains(["iam", "token", "none"], var.dlqreplay_settings.auth)
    error_message = "dlqreplay_settings.auth must be iam, token or none."
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
  type        = list(string)
  description = "IAM members allowed to call dlqreplay (user:..., group:..., serviceAccount:...)."
  default     = []

  validation {
    condition     = alltrue([for m in var.operators : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "dlqreplay is never public: allUsers and allAuthenticatedUsers are refused."
  }
}

variable "expire_schedule" {
  type        = string
  description = "Cron schedule of the Scheduler job that calls rollup's POST /expire (the ledger's expiry sweep)."
  default     = "0 * * * *"
}

variable "scheduler_time_zone" {
  type        = string
  description = "Time zone of the Scheduler jobs' cron schedules."
  default     = "Etc/UTC"
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
    dead_letters                = optional(number, 10)
    outbox_backlog              = optional(number, 1000)
    publish_failures_per_minute = optional(number, 10)
  })
  description = "Alert thresholds (pubsub-conventions.md §10) and the notification channels (ids) they notify."
  default     = {}
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the Cloud Run services and the Firestore database from terraform destroy."
  default     = true
}
