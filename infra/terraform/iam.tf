# Identities and grants: one service account per function (one per consumer
# for consume), each with only what it uses. The list is documented in
# README.md ("Service accounts and roles") and infra/infra_test.go checks that
# these grants are exactly that list. No service has a public invoker: the
# invokers are these service accounts, var.publish_invokers and
# var.operators (both refuse allUsers and allAuthenticatedUsers).

resource "google_service_account" "function" {
  for_each     = local.functions
  account_id   = "relaybus-${each.key}"
  display_name = "relaybus ${each.key}"
}

resource "google_service_account" "consume" {
  for_each     = local.consumers
  account_id   = each.value.account_id
  display_name = "relaybus consume ${each.value.service}"
  description  = "consume for ${each.value.subscription}: invokes its own service (push/Eventarc OIDC), writes the ledger, publishes rollup notices and poison dead letters."
}

# Cloud Scheduler's identity: invokes relay, rollup's /expire and dlqreplay's archive.
resource "google_service_account" "scheduler" {
  account_id   = "relaybus-scheduler"
  display_name = "relaybus Cloud Scheduler"
}

# ---- Firestore (the ledger), scoped to the ledger's database ---------------

resource "google_project_iam_member" "ledger_user" {
  for_each = toset(["publish", "relay", "rollup", "dlqreplay"])
  project  = var.project_id
  role     = "roles/datastore.user"
  member   = google_service_account.function[each.key].member

  condition {
    title      = "relaybus ledger database"
    expression = "resource.name == \"${local.ledger_database_resource}\""
  }
}

resource "google_project_iam_member" "consume_ledger_user" {
  for_each = local.consumers
  project  = var.project_id
  role     = "roles/datastore.user"
  member   = google_service_account.consume[each.key].member

  condition {
    title      = "relaybus ledger database"
    expression = "resource.name == \"${local.ledger_database_resource}\""
  }
}

# ---- Postgres URLs (Secret Manager) ----------------------------------------

resource "google_secret_manager_secret_iam_member" "function_database" {
  for_each  = toset(["publish", "relay", "dlqreplay"])
  secret_id = var.database_url_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.key].member
}

resource "google_secret_manager_secret_iam_member" "consume_database" {
  for_each  = local.consumers
  secret_id = local.consumer_database_secrets[each.key]
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.consume[each.key].member
}

# ---- Pub/Sub ---------------------------------------------------------------

# publish (fast path) and relay publish the events.
resource "google_pubsub_topic_iam_member" "publish_publisher" {
  for_each = local.topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function["publish"].member
}

resource "google_pubsub_topic_iam_member" "relay_publisher" {
  for_each = local.topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function["relay"].member
}

# consume publishes a rollup notice after every attempt...
resource "google_pubsub_topic_iam_member" "consume_rollup" {
  for_each = local.consumers
  topic    = google_pubsub_topic.rollup.name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.consume[each.key].member
}

# ...and a poison message (undecodable, no aggregate id) to its topic's DLQ.
resource "google_pubsub_topic_iam_member" "consume_dead_letter" {
  for_each = local.consumers
  topic    = google_pubsub_topic.dead_letter[each.value.topic].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.consume[each.key].member
}

# dlqreplay replays a dead letter to its original topic (for one consumer).
resource "google_pubsub_topic_iam_member" "dlqreplay_publisher" {
  for_each = local.topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function["dlqreplay"].member
}

# dlqreplay reads (archives) the dead letters.
resource "google_pubsub_subscription_iam_member" "dlqreplay_dead_letters" {
  for_each     = local.topics
  subscription = google_pubsub_subscription.dead_letter_monitor[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.function["dlqreplay"].member
}

# dlqreplay seeks consumer subscriptions (pubsub.subscriptions.consume and
# pubsub.snapshots.seek are in roles/pubsub.subscriber).
resource "google_pubsub_subscription_iam_member" "dlqreplay_seek" {
  for_each     = local.push_consumers
  subscription = google_pubsub_subscription.consumer[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.function["dlqreplay"].member
}

resource "google_pubsub_subscription_iam_member" "dlqreplay_seek_eventarc" {
  for_each     = local.eventarc_consumers
  subscription = google_eventarc_trigger.consumer[each.key].transport[0].pubsub[0].subscription
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.function["dlqreplay"].member
}

# Snapshots for rebuilds (create, list, get, delete): only these permissions.
resource "google_project_iam_custom_role" "snapshots" {
  role_id     = "relaybusSnapshots"
  title       = "relaybus snapshots"
  description = "Create, list, read and delete Pub/Sub snapshots (dlqreplay's seek to a snapshot)."
  permissions = [
    "pubsub.snapshots.create",
    "pubsub.snapshots.delete",
    "pubsub.snapshots.get",
    "pubsub.snapshots.list",
    "pubsub.snapshots.seek",
  ]
}

resource "google_project_iam_member" "dlqreplay_snapshots" {
  project = var.project_id
  role    = google_project_iam_custom_role.snapshots.name
  member  = google_service_account.function["dlqreplay"].member
}

# ---- Pub/Sub service agent ---------------------------------------------------

# Publishes dead letters to every <topic>.dlq...
resource "google_pubsub_topic_iam_member" "agent_dead_letter" {
  for_each = local.topics
  topic    = google_pubsub_topic.dead_letter[each.key].name
  role     = "roles/pubsub.publisher"
  member   = local.pubsub_service_agent
}

# ...acknowledging them on the source subscription.
resource "google_pubsub_subscription_iam_member" "agent_push" {
  for_each     = local.push_consumers
  subscription = google_pubsub_subscription.consumer[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "agent_eventarc" {
  for_each     = local.eventarc_consumers
  subscription = google_eventarc_trigger.consumer[each.key].transport[0].pubsub[0].subscription
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

# Mints the OIDC tokens of push and Eventarc deliveries (needed in projects
# created before April 2021; harmless after).
resource "google_service_account_iam_member" "agent_token_creator_consume" {
  for_each           = local.consumers
  service_account_id = google_service_account.consume[each.key].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

resource "google_service_account_iam_member" "agent_token_creator_rollup" {
  service_account_id = google_service_account.function["rollup"].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# ---- Invokers (never allUsers / allAuthenticatedUsers) ----------------------

# Each consumer's subscription (or trigger) invokes its consume service as the
# consumer's own service account.
resource "google_cloud_run_v2_service_iam_member" "consume_invoker" {
  for_each = local.consumers
  location = var.region
  name     = google_cloud_run_v2_service.consume[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.consume[each.key].member
}

# The rollup subscription (or trigger) invokes rollup as rollup's account.
resource "google_cloud_run_v2_service_iam_member" "rollup_invoker" {
  location = var.region
  name     = google_cloud_run_v2_service.function["rollup"].name
  role     = "roles/run.invoker"
  member   = google_service_account.function["rollup"].member
}

resource "google_cloud_run_v2_service_iam_member" "scheduler_invoker" {
  for_each = toset(["relay", "rollup", "dlqreplay"])
  location = var.region
  name     = google_cloud_run_v2_service.function[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

resource "google_cloud_run_v2_service_iam_member" "publish_invokers" {
  for_each = toset(var.publish_invokers)
  location = var.region
  name     = google_cloud_run_v2_service.function["publish"].name
  role     = "roles/run.invoker"
  member   = each.key
}

resource "google_cloud_run_v2_service_iam_member" "operators" {
  for_each = toset(var.operators)
  location = var.region
  name     = google_cloud_run_v2_service.function["dlqreplay"].name
  role     = "roles/run.invoker"
  member   = each.key
}
