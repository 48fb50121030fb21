# Identities and grants: one service account per function (one per consumer
# for consume), each with only what it uses. The list is documented in
# infra/terraform/README.md ("Service accounts and roles") and infra/terraform_test.go checks
# that these grants are exactly that list. No service has a public invoker:
# the invokers are these service accounts, var.publish_invokers and
# var.operators (both refuse allUsers and allAuthenticatedUsers).
#
# Propagation. IAM changes are eventually consistent: "typically 2 minutes,
# potentially 7 minutes or longer"
# (https://cloud.google.com/iam/docs/access-change-propagation); Secret
# Manager's access checks too
# (https://cloud.google.com/secret-manager/docs/reference/consistency). So
# three time_sleep resources stand between grants and their first use, each
# re-run only when the grants it covers change:
#   iam_propagation                before the Cloud Run services (a revision
#                                  reads its secrets and mounts Cloud SQL when
#                                  it starts), the sync job's execution, the
#                                  Eventarc triggers (the Eventarc service
#                                  agent's role: a fresh project's first
#                                  trigger otherwise fails with "Permission
#                                  denied while using the Eventarc Service
#                                  Agent", provider issue
#                                  https://github.com/hashicorp/terraform-provider-google/issues/14584);
#   consume_invoker_propagation    before the consumers' push subscriptions
#                                  and Eventarc triggers (and the forwarders
#                                  service's Scheduler jobs, forwarders.tf);
#   function_invoker_propagation   before the Scheduler jobs, the rollup
#                                  subscription and the DLQ monitor push
#                                  subscriptions.

resource "google_service_account" "function" {
  for_each     = toset(["publish", "relay", "rollup", "dlqreplay"])
  account_id   = "relaybus-${each.key}"
  display_name = "relaybus ${each.key}"
}

resource "google_service_account" "consume" {
  for_each     = local.consumers
  account_id   = each.value.account_id
  display_name = "relaybus consume ${each.value.service}"
  description  = "consume for ${each.value.subscription}: invokes its own service (push/Eventarc OIDC), publishes rollup notices, poison dead letters and its child events; no Firestore access."
}

# Cloud Scheduler's identity: invokes the relay (one job per database),
# rollup's /reconcile and /expire, and every consume service's /ledger:ship
# and /inbox:purge.
resource "google_service_account" "scheduler" {
  account_id   = "relaybus-scheduler"
  display_name = "relaybus Cloud Scheduler"
}

# The migrate step's identity (database.tf, "Roles"): the only reader of the
# databases' owner URLs and of the runtime roles' passwords.
resource "google_service_account" "migrate" {
  account_id   = "relaybus-migrate"
  display_name = "relaybus migrate"
  description  = "The relaybus-migrate-<database> jobs: migrate each Cloud SQL database as its owner and set the functions' and consumers' roles."
}

# The identity of the <topic>.dlq-monitor push subscriptions: it may only
# invoke dlqreplay, and dlqreplay lets only it POST /deadletters:archive
# (DLQREPLAY_ARCHIVERS).
resource "google_service_account" "dead_letter_push" {
  account_id   = "relaybus-dlq-push"
  display_name = "relaybus dead-letter archive push"
  description  = "OIDC identity of every <topic>.dlq-monitor push subscription: POSTs dead letters to dlqreplay /deadletters:archive."
}

# ---- Firestore: the ledger and the audit log, each scoped to its database --
# Firestore's IAM has no per-collection grants for server clients: a grant
# is on a database (the IAM condition), so the split is by database and by
# permission. No runtime identity may delete a document anywhere (Firestore's
# TTL policies delete the ledger's old documents themselves); the consumers
# hold nothing on Firestore (they record through the rollup topic); only
# dlqreplay may touch the audit log's database, to create and read entries.

# The ledger's writers: read, create and update documents, run
# transactions; not delete.
resource "google_project_iam_custom_role" "ledger_writer" {
  role_id     = "relaybusLedgerWriter"
  title       = "relaybus ledger writer"
  description = "Read, create and update Firestore documents and run transactions; no delete (the ledger's TTL policies delete old documents)."
  permissions = [
    "datastore.databases.get",
    "datastore.databases.getMetadata",
    "datastore.entities.create",
    "datastore.entities.get",
    "datastore.entities.list",
    "datastore.entities.update",
  ]
}

# The audit log's appender: create and read entries; not update, not delete.
resource "google_project_iam_custom_role" "audit_appender" {
  role_id     = "relaybusAuditAppender"
  title       = "relaybus audit appender"
  description = "Create and read Firestore documents only: the operators' audit log is append-only for its one writer."
  permissions = [
    "datastore.databases.getMetadata",
    "datastore.entities.create",
    "datastore.entities.get",
    "datastore.entities.list",
  ]
}

resource "google_project_iam_member" "ledger_user" {
  for_each = toset(["publish", "relay", "rollup", "dlqreplay"])
  project  = var.project_id
  role     = google_project_iam_custom_role.ledger_writer.name
  member   = google_service_account.function[each.key].member

  condition {
    title      = "relaybus ledger database"
    expression = "resource.name == \"${local.ledger_database_resource}\""
  }
}

resource "google_project_iam_member" "dlqreplay_audit" {
  project = var.project_id
  role    = google_project_iam_custom_role.audit_appender.name
  member  = google_service_account.function["dlqreplay"].member

  condition {
    title      = "relaybus audit database"
    expression = "resource.name == \"${local.audit_database_resource}\""
  }
}

# ---- Postgres: URL secrets (Secret Manager) and Cloud SQL Client ------------
# Each service reads the URL of its own role on each database it uses
# (local.role_secret_ids, database.tf "Roles"); only the migrate job reads
# the owners' URLs and the roles' passwords.

# publish: main.
resource "google_secret_manager_secret_iam_member" "main_database_url" {
  for_each  = toset(["publish"])
  secret_id = local.role_secret_ids["main/publish"]
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.key].member
}

# dlqreplay: every database (local.function_databases), so a consumer with
# its own database gets a true replay dry run, outbox state, gap list and
# rebuild.
resource "google_secret_manager_secret_iam_member" "dlqreplay_database_url" {
  for_each  = local.databases
  secret_id = local.role_secret_ids["${each.key}/dlqreplay"]
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function["dlqreplay"].member
}

moved {
  from = google_secret_manager_secret_iam_member.main_database_url["dlqreplay"]
  to   = google_secret_manager_secret_iam_member.dlqreplay_database_url["main"]
}

# The relay drains every database.
resource "google_secret_manager_secret_iam_member" "relay_database_url" {
  for_each  = local.databases
  secret_id = local.role_secret_ids["${each.key}/relay"]
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function["relay"].member
}

# Each consumer: its own role on its own database only.
resource "google_secret_manager_secret_iam_member" "consume_database_url" {
  for_each  = local.consumers
  secret_id = local.role_secret_ids["${each.value.database}/${each.key}"]
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.consume[each.key].member
}

# The migrate job: each Cloud SQL database's owner URL and roles.
resource "google_secret_manager_secret_iam_member" "migrate_owner_url" {
  for_each  = local.cloudsql_databases
  secret_id = google_secret_manager_secret.database_url[each.key].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.migrate.member
}

resource "google_secret_manager_secret_iam_member" "migrate_roles" {
  for_each  = local.cloudsql_databases
  secret_id = google_secret_manager_secret.database_roles[each.key].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.migrate.member
}

resource "google_project_iam_member" "migrate_cloudsql_client" {
  count   = local.use_cloud_sql ? 1 : 0
  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = google_service_account.migrate.member
}

# A forward consumer that signs its requests (forward_auth hmac): its
# signing secret (topology: forward_secret), created by the operator.
resource "google_secret_manager_secret_iam_member" "consume_signing_secret" {
  for_each  = local.consume_signing_secrets
  secret_id = local.consume_signing_secrets[each.key]
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.consume[each.key].member
}

# dlqreplay's shared token (DLQREPLAY_AUTH=token only).
resource "google_secret_manager_secret_iam_member" "dlqreplay_token" {
  count     = length(local.dlqreplay_token_secret)
  secret_id = var.dlqreplay_settings.token_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function["dlqreplay"].member
}

# PRIVACY_KEY (var.privacy_key_secret only): every function reads it.
resource "google_secret_manager_secret_iam_member" "privacy_key" {
  for_each  = var.privacy_key_secret != "" ? local.functions : {}
  secret_id = var.privacy_key_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.key].member
}

# Connecting through the Cloud SQL volume needs Cloud SQL Client
# (cloudsql.instances.connect, cloudsql.instances.get):
# https://cloud.google.com/sql/docs/postgres/connect-run.
resource "google_project_iam_member" "cloudsql_client" {
  for_each = toset([for f in ["publish", "relay", "dlqreplay"] : f if local.function_uses_cloudsql[f]])
  project  = var.project_id
  role     = "roles/cloudsql.client"
  member   = google_service_account.function[each.key].member
}

resource "google_project_iam_member" "consume_cloudsql_client" {
  for_each = { for k, c in local.consumers : k => c if local.consume_uses_cloudsql[k] }
  project  = var.project_id
  role     = "roles/cloudsql.client"
  member   = google_service_account.consume[each.key].member
}

# ---- Pub/Sub ---------------------------------------------------------------

# publish (fast path) and relay publish the events.
resource "google_pubsub_topic_iam_member" "publish_publisher" {
  for_each = local.pubsub_topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function["publish"].member
}

resource "google_pubsub_topic_iam_member" "relay_publisher" {
  for_each = local.pubsub_topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function["relay"].member
}

# consume publishes a rollup notice after every attempt...
resource "google_pubsub_topic_iam_member" "consume_rollup" {
  for_each = local.pubsub_consumers
  topic    = google_pubsub_topic.rollup[0].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.consume[each.key].member
}

# ...and a poison message (undecodable, no aggregate id) to its topic's DLQ.
resource "google_pubsub_topic_iam_member" "consume_dead_letter" {
  for_each = local.pubsub_consumers
  topic    = google_pubsub_topic.dead_letter[each.value.topic].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.consume[each.key].member
}

# ...and its handler's child events (topology: emits), right after its
# transaction commits: without this the kick is refused (PermissionDenied)
# and the children wait for the relay's next Scheduler drain.
resource "google_pubsub_topic_iam_member" "consume_emits" {
  for_each = local.on_pubsub ? local.consumer_emits : {}
  topic    = google_pubsub_topic.topic[each.value.topic].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.consume[each.value.consumer].member
}

# ...and, for a forward consumer delivered by Eventarc, what its circuit
# breaker kept while the target was down, to its own topic (addressed to it
# alone) when the probe resumes it (functions/consume/breakerflag.go).
resource "google_pubsub_topic_iam_member" "consume_republish" {
  for_each = local.on_pubsub ? local.breaker_flag_consumers : {}
  topic    = google_pubsub_topic.topic[each.value.topic].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.consume[each.key].member
}

# dlqreplay replays a dead letter to its original topic (for one consumer).
resource "google_pubsub_topic_iam_member" "dlqreplay_publisher" {
  for_each = local.pubsub_topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function["dlqreplay"].member
}

# dlqreplay seeks consumer subscriptions (pubsub.subscriptions.consume and
# pubsub.snapshots.seek are in roles/pubsub.subscriber). It no longer reads
# the <topic>.dlq-monitor subscriptions: they push to it.
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

# Pause and resume of a push consumer: read and update its subscription's
# push_config (pubsub.subscriptions.get/update), on the push consumers'
# subscriptions only...
resource "google_project_iam_custom_role" "push_control" {
  role_id     = "relaybusPushControl"
  title       = "relaybus push control"
  description = "Read a subscription and update its push configuration (dlqreplay's consumer pause and resume)."
  permissions = [
    "pubsub.subscriptions.get",
    "pubsub.subscriptions.update",
  ]
}

resource "google_pubsub_subscription_iam_member" "dlqreplay_push_control" {
  for_each     = local.push_consumers
  subscription = google_pubsub_subscription.consumer[each.key].name
  role         = google_project_iam_custom_role.push_control.name
  member       = google_service_account.function["dlqreplay"].member
}

# ...and setting a push endpoint's OIDC identity back needs
# iam.serviceAccounts.actAs on that identity (the consumer's account), as
# creating the push subscription does
# (https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions).
resource "google_service_account_iam_member" "dlqreplay_act_as_consume" {
  for_each           = local.push_consumers
  service_account_id = google_service_account.consume[each.key].name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.function["dlqreplay"].member
}

# A forward consumer's circuit breaker pauses and resumes its own push
# subscription (functions/consume/breakerpause.go): the same narrow role
# as dlqreplay's, on that one subscription only...
resource "google_pubsub_subscription_iam_member" "consume_push_control" {
  for_each     = local.breaker_pause_consumers
  subscription = google_pubsub_subscription.consumer[each.key].name
  role         = google_project_iam_custom_role.push_control.name
  member       = google_service_account.consume[each.key].member
}

# ...and setting its push identity (its own account) back needs actAs on it.
resource "google_service_account_iam_member" "consume_act_as_self" {
  for_each           = local.breaker_pause_consumers
  service_account_id = google_service_account.consume[each.key].name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.consume[each.key].member
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

# ---- Service agents ---------------------------------------------------------

# The Eventarc service agent manages the triggers' Pub/Sub subscriptions.
# Google grants it this role when the first Eventarc resource is created;
# granting it here (to the identity created in main.tf) and waiting for it is
# what lets the first trigger of a fresh project succeed
# (https://cloud.google.com/eventarc/standard/docs/run/roles-permissions).
resource "google_project_iam_member" "eventarc_agent" {
  project = var.project_id
  role    = "roles/eventarc.serviceAgent"
  member  = local.eventarc_service_agent
}

# The Pub/Sub service agent publishes dead letters to every <topic>.dlq...
resource "google_pubsub_topic_iam_member" "agent_dead_letter" {
  for_each = local.pubsub_topics
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

# It mints the OIDC tokens of push and Eventarc deliveries: needed where the
# Pub/Sub service agent was enabled on or before April 8, 2021, harmless
# after (https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions).
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

resource "google_service_account_iam_member" "agent_token_creator_dead_letter_push" {
  service_account_id = google_service_account.dead_letter_push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# ---- Invokers (never allUsers / allAuthenticatedUsers) ----------------------

locals {
  # The topology's publishers that var.publish_invokers does not already
  # admit (one resource per binding member; see topology_publishers).
  topology_only_publishers = toset([for m in local.topology_publishers : m if !contains(var.publish_invokers, m)])
  # var.publishers that neither var.publish_invokers nor the topology's
  # publishers already admit.
  variable_only_publishers = toset([
    for m in local.variable_publishers : m if !contains(var.publish_invokers, m) && !contains(local.topology_publishers, m)
  ])
}

# Each consumer's subscription (or trigger) invokes its consume service as the
# consumer's own service account.
resource "google_cloud_run_v2_service_iam_member" "consume_invoker" {
  for_each = local.consumers
  location = var.region
  name     = google_cloud_run_v2_service.consume[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.consume[each.key].member
}

# Scheduler calls every consume service's /ledger:ship and /inbox:purge.
resource "google_cloud_run_v2_service_iam_member" "scheduler_consume_invoker" {
  for_each = local.consumers
  location = var.region
  name     = google_cloud_run_v2_service.consume[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

# The rollup subscription (or trigger) invokes rollup as rollup's account.
resource "google_cloud_run_v2_service_iam_member" "rollup_invoker" {
  location = var.region
  name     = google_cloud_run_v2_service.function["rollup"].name
  role     = "roles/run.invoker"
  member   = google_service_account.function["rollup"].member
}

# Scheduler calls the relay (per database) and rollup (/reconcile, /expire).
resource "google_cloud_run_v2_service_iam_member" "scheduler_invoker" {
  for_each = toset(["relay", "rollup"])
  location = var.region
  name     = google_cloud_run_v2_service.function[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

# The DLQ monitor push subscriptions call dlqreplay /deadletters:archive.
resource "google_cloud_run_v2_service_iam_member" "dead_letter_push_invoker" {
  location = var.region
  name     = google_cloud_run_v2_service.function["dlqreplay"].name
  role     = "roles/run.invoker"
  member   = google_service_account.dead_letter_push.member
}

resource "google_cloud_run_v2_service_iam_member" "publish_invokers" {
  for_each = toset(var.publish_invokers)
  location = var.region
  name     = google_cloud_run_v2_service.function["publish"].name
  role     = "roles/run.invoker"
  member   = each.key
}

# Each topic's publishers (topology publishers) may invoke publish, which
# then lets each write only its topics (PUBLISH_AUTH=cloudrun). A principal
# already in var.publish_invokers is left out: two resources granting one
# binding compete (destroying either removes the member for both).
resource "google_cloud_run_v2_service_iam_member" "topology_publishers" {
  for_each = local.topology_only_publishers
  location = var.region
  name     = google_cloud_run_v2_service.function["publish"].name
  role     = "roles/run.invoker"
  member   = each.key
}

# var.publishers may invoke publish, which then lets each write only its
# topics (PUBLISH_PUBLISHERS); those already admitted above are left out,
# as for the topology's.
resource "google_cloud_run_v2_service_iam_member" "publishers" {
  for_each = local.variable_only_publishers
  location = var.region
  name     = google_cloud_run_v2_service.function["publish"].name
  role     = "roles/run.invoker"
  member   = each.key
}

# Operators call dlqreplay with their Google ID token
# (`relaybus -gcloud-auth ...`); Cloud Run IAM admits them, dlqreplay reads
# who they are from the token (DLQREPLAY_AUTH=cloudrun) and their roles from
# var.operators (DLQREPLAY_ROLES) and the topology's operators.
resource "google_cloud_run_v2_service_iam_member" "operators" {
  for_each = local.operator_members
  location = var.region
  name     = google_cloud_run_v2_service.function["dlqreplay"].name
  role     = "roles/run.invoker"
  member   = each.key
}

# ---- Waits for propagation (see the top of this file) -----------------------

resource "time_sleep" "iam_propagation" {
  create_duration = var.propagation_waits.iam
  triggers = {
    grants = sha1(jsonencode(concat([
      [for g in google_project_iam_member.ledger_user : g.id],
      google_project_iam_member.dlqreplay_audit.id,
      [for g in google_secret_manager_secret_iam_member.main_database_url : g.id],
      [for g in google_secret_manager_secret_iam_member.relay_database_url : g.id],
      [for g in google_secret_manager_secret_iam_member.dlqreplay_database_url : g.id],
      [for g in google_secret_manager_secret_iam_member.consume_database_url : g.id],
      [for g in google_secret_manager_secret_iam_member.migrate_owner_url : g.id],
      [for g in google_secret_manager_secret_iam_member.migrate_roles : g.id],
      google_project_iam_member.migrate_cloudsql_client[*].id,
      [for g in google_secret_manager_secret_iam_member.consume_signing_secret : g.id],
      google_secret_manager_secret_iam_member.dlqreplay_token[*].id,
      [for g in google_secret_manager_secret_iam_member.privacy_key : g.id],
      [for g in google_secret_manager_secret_iam_member.nats_credentials_function : g.id],
      [for g in google_secret_manager_secret_iam_member.nats_credentials_consume : g.id],
      [for g in google_project_iam_member.cloudsql_client : g.id],
      [for g in google_project_iam_member.consume_cloudsql_client : g.id],
      google_project_iam_member.eventarc_agent.id,
      [for g in google_service_account_iam_member.agent_token_creator_consume : g.id],
      google_service_account_iam_member.agent_token_creator_rollup.id,
      google_service_account_iam_member.agent_token_creator_dead_letter_push.id,
      [for g in google_service_account_iam_member.dlqreplay_act_as_consume : g.id],
      [for g in google_service_account_iam_member.consume_act_as_self : g.id],
      [for g in google_project_iam_member.telemetry_trace_writer : g.id],
      [for g in google_project_iam_member.telemetry_metric_writer : g.id],
      [for g in google_project_iam_member.consume_telemetry_trace_writer : g.id],
      [for g in google_project_iam_member.consume_telemetry_metric_writer : g.id],
      [for g in google_project_iam_member.telemetry_quota_user : g.id],
      [for g in google_project_iam_member.consume_telemetry_quota_user : g.id],
      # The forwarders' (forwarders.tf), only when they are deployed: the
      # hash, and so the wait, stays as it was for a deployment without.
      ], local.forwarders_enabled ? [
      google_secret_manager_secret_iam_member.forwarders_database_url[*].id,
      google_project_iam_member.forwarders_cloudsql_client[*].id,
      google_project_iam_member.forwarders_telemetry_trace_writer[*].id,
      google_project_iam_member.forwarders_telemetry_metric_writer[*].id,
      google_project_iam_member.forwarders_telemetry_quota_user[*].id,
      google_service_account_iam_member.agent_token_creator_forwarders_push[*].id,
      google_project_iam_member.agent_forwarders_dead_letter[*].id,
      google_project_iam_member.dlqreplay_forwarder_subscriptions[*].id,
      google_service_account_iam_member.dlqreplay_act_as_forwarders_push[*].id,
      google_project_iam_member.forwarders_push_control[*].id,
      google_project_iam_member.dlqreplay_forwarders_push_control[*].id,
      google_service_account_iam_member.forwarders_act_as_push[*].id,
      # The forwarders' signing key (forwarders.key_secret), only when set.
      ] : [], length(local.forwarders_key_secret) > 0 ? [
      google_secret_manager_secret_iam_member.forwarders_key[*].id,
      google_secret_manager_secret_iam_member.dlqreplay_forwarders_key[*].id,
      # Its NATS credentials (on NATS with credentials_secret only).
      ] : [], local.forwarders_enabled && length(local.nats_credentials) > 0 ? [
      google_secret_manager_secret_iam_member.nats_credentials_forwarders[*].id,
    ] : [])))
  }
}

resource "time_sleep" "consume_invoker_propagation" {
  create_duration = var.propagation_waits.iam
  triggers = {
    grants = sha1(jsonencode(concat([
      [for g in google_cloud_run_v2_service_iam_member.consume_invoker : g.id],
      [for g in google_cloud_run_v2_service_iam_member.scheduler_consume_invoker : g.id],
      ], local.forwarders_enabled ? [
      google_cloud_run_v2_service_iam_member.forwarders_push_invoker[*].id,
      google_cloud_run_v2_service_iam_member.scheduler_forwarders_invoker[*].id,
    ] : [])))
  }
}

resource "time_sleep" "function_invoker_propagation" {
  create_duration = var.propagation_waits.iam
  triggers = {
    grants = sha1(jsonencode([
      google_cloud_run_v2_service_iam_member.rollup_invoker.id,
      [for g in google_cloud_run_v2_service_iam_member.scheduler_invoker : g.id],
      google_cloud_run_v2_service_iam_member.dead_letter_push_invoker.id,
    ]))
  }
}

locals {
  # Who Cloud Run admits to dlqreplay: every member var.operators and the
  # topology's operators grant a role to.
  operator_members = toset(concat([for o in var.operators : o.member], [for m in local.topology_operators : m]))

  # var.publishers as IAM members (a bare email is a service account's when
  # it ends in .gserviceaccount.com, else a user's).
  variable_publishers = toset(flatten([
    for t, ms in var.publishers : [
      for m in ms : (
        length(regexall("^(serviceAccount|user):", m)) > 0 ? m :
        length(regexall("\\.gserviceaccount\\.com$", m)) > 0 ? "serviceAccount:${m}" : "user:${m}"
      )
    ]
  ]))
}
