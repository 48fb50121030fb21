# relaybus on Google Cloud: everything below is derived from the topology
# (topology.tf) and the variables. Files by concern: pubsub.tf (topics,
# subscriptions, dead letters), eventarc.tf (triggers and their subscription
# policies), run.tf (Cloud Run services), database.tf (Cloud SQL, database
# URLs in Secret Manager, pool sizes), iam.tf (identities, grants and the
# waits for their propagation), scheduler.tf (relay drains, ledger catch-up,
# inbox purge, reconcile, expiry), firestore.tf (ledger database, indexes,
# TTL, topic_consumers), monitoring.tf (log-based metrics, alerts).
#
# Prerequisites that cannot be part of this configuration (docs/deploying.md,
# "1. What cannot be in the same terraform apply"): the Cloud Resource Manager and Service Usage
# APIs must be enabled before the first plan, because the provider needs them
# to read the project and to enable every other API below.

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  function_names = ["publish", "relay", "consume", "rollup", "dlqreplay"]

  # <image_repository>/<function>:<image_tag>, unless image_overrides names one.
  images = merge(
    { for f in local.function_names : f => "${var.image_repository}/${f}:${var.image_tag}" },
    var.image_overrides,
  )

  # The Pub/Sub service agent (service-<number>@gcp-sa-pubsub.iam.gserviceaccount.com):
  # publishes dead letters, acknowledges them on the source subscription and
  # mints the OIDC tokens of push and Eventarc deliveries. Created explicitly
  # (google_project_service_identity) so no grant races its lazy creation.
  pubsub_service_agent = google_project_service_identity.pubsub.member

  # The Eventarc service agent (service-<number>@gcp-sa-eventarc.iam.gserviceaccount.com).
  eventarc_service_agent = google_project_service_identity.eventarc.member

  # The Firestore databases IAM grants are scoped to (IAM condition).
  ledger_database_resource = "projects/${var.project_id}/databases/${var.firestore_database}"
  audit_database_resource  = "projects/${var.project_id}/databases/${var.audit_firestore_database}"
}

resource "google_project_service" "api" {
  for_each = toset([
    "cloudscheduler.googleapis.com",
    "eventarc.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    # Cloud Run's Cloud SQL volume connects through the Cloud SQL Admin API
    # (https://cloud.google.com/sql/docs/postgres/connect-run).
    "sqladmin.googleapis.com",
  ])
  project            = var.project_id
  service            = each.key
  disable_on_destroy = false
}

# Enabling an API is eventually consistent: the provider's own guide
# recommends a sleep before the first use
# (https://registry.terraform.io/providers/hashicorp/google/6.14.1/docs/guides/google_project_service#newly-activated-service-errors).
resource "time_sleep" "api_propagation" {
  create_duration = var.propagation_waits.api
  triggers        = { apis = join(",", sort(concat(keys(google_project_service.api), keys(google_project_service.telemetry)))) }
}

# The service agents, created before anything grants them a role. Enabling
# an API does not always create its agent at once; granting a role to an
# agent that does not exist yet fails.
resource "google_project_service_identity" "pubsub" {
  provider   = google-beta
  project    = var.project_id
  service    = "pubsub.googleapis.com"
  depends_on = [time_sleep.api_propagation]
}

resource "google_project_service_identity" "eventarc" {
  provider   = google-beta
  project    = var.project_id
  service    = "eventarc.googleapis.com"
  depends_on = [time_sleep.api_propagation]
}

# The topology's names, checked before anything is created (the rules are in
# topology.tf, local.naming_errors; internal/names and shared/topology apply the
# same rules to the local stack). Everything derived from the topology
# depends on this resource.
resource "terraform_data" "topology" {
  input = local.topology_hash

  lifecycle {
    precondition {
      condition     = length(local.naming_errors) == 0
      error_message = "infra/topology.yaml breaks the naming rules: ${join("; ", local.naming_errors)}"
    }
  }
}
