# relaybus on Google Cloud: everything below is derived from the topology
# (topology.tf) and the variables. Files by concern: pubsub.tf (topics,
# subscriptions, dead letters), eventarc.tf (triggers and their subscription
# policies), run.tf (Cloud Run services), iam.tf (identities and grants),
# scheduler.tf (relay and expiry jobs), firestore.tf (ledger database,
# indexes, topic_consumers), monitoring.tf (log-based metrics, alerts).

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

  # The Pub/Sub service agent: publishes dead letters, pulls for push
  # subscriptions, mints the OIDC tokens of push and Eventarc deliveries.
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  # The Firestore database IAM grants are scoped to (IAM condition).
  ledger_database_resource = "projects/${var.project_id}/databases/${var.firestore_database}"

  # Secret holding each consumer's Postgres URL.
  consumer_database_secrets = {
    for k, c in local.consumers : k => lookup(var.consumer_database_url_secrets, c.service, var.database_url_secret)
  }
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
  ])
  project            = var.project_id
  service            = each.key
  disable_on_destroy = false
}
