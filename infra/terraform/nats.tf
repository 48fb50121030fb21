# The NATS JetStream transport (var.nats; off by default: Pub/Sub).
#
# With var.nats set, relaybus runs on a NATS server the deployment reaches
# from Cloud Run (one it runs itself, on GKE or Compute Engine behind a VPC
# connector or Direct VPC egress, or a managed one such as Synadia Cloud),
# and Terraform creates no Pub/Sub topic, subscription, schema or Eventarc
# trigger:
#   - every function gets TRANSPORT=nats and NATS_URL, and, with
#     credentials_secret, NATS_CREDS: a NATS credentials file (the user JWT
#     and NKey seed `nsc` writes) held in Secret Manager and mounted read-only
#     at /secrets/nats/creds, readable by each function's own account;
#   - JetStream has no push, so every consumer runs in pull mode (pull.tf's
#     consume services, without their Pub/Sub subscription): always-on
#     instances pulling the consumer's durable consumer; with
#     forwarders.enabled, the forwarders service (forwarders.tf) pulls every
#     forwarder's on exactly one always-on instance;
#   - rollup (ROLLUP_MODE=pull) and the operations API (ARCHIVE_MODE=pull)
#     pull the rollup's notices and every topic's DLQ monitor themselves, on
#     min_instances always-on instances each with CPU always allocated; each
#     creates the topology's streams and durable consumers at its start
#     (nats.Client.Provision, idempotent), so the first apply needs no step
#     outside Terraform and a changed topology is applied by the next
#     revision;
#   - the Pub/Sub retry and dead-letter policies are the pull workers' own
#     (internal/pull), as on the local stack.
# Reaching a private server from Cloud Run needs the services' VPC egress,
# which this configuration does not create (docs/deploying.md, "On NATS").
# var.nats is declared in variables.tf.

locals {
  on_nats   = var.nats != null
  on_pubsub = !local.on_nats

  # What every function and consume service adds to its environment.
  nats_env = local.on_nats ? merge(
    { TRANSPORT = "nats", NATS_URL = var.nats.url },
    var.nats.credentials_secret != "" ? { NATS_CREDS = "/secrets/nats/creds" } : {},
  ) : {}
  # The credentials secret, when there is one, as a list for dynamic blocks.
  nats_credentials = local.on_nats && try(var.nats.credentials_secret, "") != "" ? [var.nats.credentials_secret] : []

  # The functions that pull on NATS instead of taking pushes.
  nats_pullers = local.on_nats ? ["rollup", "dlqreplay"] : []

  # The instances dlqreplay may run: its max_instances, or on NATS at least
  # the always-on min_instances (run.tf sets both bounds so); database.tf
  # counts its pools by this.
  dlqreplay_max_instances = max(var.dlqreplay_settings.max_instances, local.on_nats ? try(var.nats.min_instances, 1) : 0)

  # Pub/Sub's resources exist only on Pub/Sub.
  pubsub_topics         = local.on_pubsub ? local.topics : {}
  pubsub_consumers      = local.on_pubsub ? local.consumers : {}
  pubsub_pull_consumers = local.on_pubsub ? local.pull_consumers : {}
  pubsub_topic_schemas  = local.on_pubsub ? local.topic_schemas : {}
}

# Each function's and each consume service's account reads the credentials.
resource "google_secret_manager_secret_iam_member" "nats_credentials_function" {
  for_each  = length(local.nats_credentials) > 0 ? local.functions : {}
  secret_id = var.nats.credentials_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.key].member
}

resource "google_secret_manager_secret_iam_member" "nats_credentials_consume" {
  for_each  = length(local.nats_credentials) > 0 ? local.consumers : {}
  secret_id = var.nats.credentials_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.consume[each.key].member
}
