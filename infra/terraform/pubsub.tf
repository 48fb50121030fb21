# Topics, dead-letter topics and the push subscriptions of the topology.
#
# Ordering is a subscription setting (the relay publishes with ordering key =
# aggregate id); every push consumer subscription has it, and it cannot be
# switched on later. Subscriptions never expire (expiration_policy ttl "") and
# keep acknowledged messages for their retention so dlqreplay can seek back
# and rebuild a projection.

resource "google_pubsub_topic" "topic" {
  for_each                   = local.pubsub_topics
  name                       = each.key
  message_retention_duration = "${each.value.message_retention_seconds}s"
  labels                     = { encoding = each.value.encoding }

  # A topic with a schema (topology schemas): Pub/Sub validates every
  # message's data against it; the relay writes such a topic in CloudEvents
  # binary mode (the data is the payload). No revision range: the provider
  # has no first/last_revision_id (hashicorp/terraform-provider-google#25839),
  # and without one Pub/Sub accepts a message valid against any revision
  # (https://cloud.google.com/pubsub/docs/reference/rest/v1/projects.topics#SchemaSettings),
  # so every version still declared, each a revision, is covered.
  dynamic "schema_settings" {
    for_each = contains(keys(local.topic_schemas), each.key) ? [local.topic_schemas[each.key]] : []
    content {
      schema   = google_pubsub_schema.topic[each.key].id
      encoding = schema_settings.value.encoding
    }
  }

  depends_on = [time_sleep.api_propagation, terraform_data.topology, terraform_data.schema_revisions]
}

# One Pub/Sub schema per topic with schemas, named after the topic, whose
# definition is its newest version's file. Changing the definition commits a
# new revision in place (hashicorp/terraform-provider-google#13997, since
# 4.x; revisions are not deleted by Terraform, GoogleCloudPlatform/magic-modules#9070).
resource "google_pubsub_schema" "topic" {
  for_each   = local.pubsub_topic_schemas
  name       = each.key
  type       = each.value.pubsub_type
  definition = file(each.value.files[length(each.value.files) - 1])
  depends_on = [time_sleep.api_propagation]
}

# Every version a topic declares is a revision of its schema, so its
# messages validate (Pub/Sub accepts a message valid against any revision).
# The provider holds only the latest definition, and Pub/Sub keeps at most
# 20 revisions of a schema: committing every version again on each change,
# and never deleting one, hit the cap after a few versions (v1 to v5 made
# 23). `relaybus schemas sync` (cmd/relaybus) makes the schema hold exactly
# one revision per declared version, the newest last: it deletes the
# revisions of retired versions, commits the missing ones, and commits the
# newest again only if it is not the latest. Re-run when a file changes.
# Every argument is single-quoted for the shell (a path may hold a space or
# a quote; infra/firstapply_test.go runs the command through sh).
resource "terraform_data" "schema_revisions" {
  for_each         = local.pubsub_topic_schemas
  triggers_replace = [google_pubsub_schema.topic[each.key].id, [for f in each.value.files : sha1(file(f))]]

  provisioner "local-exec" {
    command = join(" ", [for a in [var.relaybus, "schemas", "sync", "--project=${var.project_id}", "--topology=${local.topology_path}", "--topic=${each.key}"] : "'${replace(a, "'", "'\\''")}'"])
  }
}

# <topic>.dlq: Pub/Sub dead-letters a message here after the subscription's
# max delivery attempts; consume publishes poison messages here directly.
resource "google_pubsub_topic" "dead_letter" {
  for_each                   = local.pubsub_topics
  name                       = each.value.dead_letter_topic
  message_retention_duration = "${each.value.message_retention_seconds}s"
  depends_on                 = [time_sleep.api_propagation, terraform_data.topology]
}

# <topic>.dlq-monitor: pushes every dead letter to dlqreplay's
# POST /deadletters:archive, which files it in the ledger's dead_letters
# collection (a letter is visible to operators seconds after it dies). A pull
# subscription nobody pulled would keep every letter unacknowledged for the
# whole retention, and nothing would archive it.
#
# Push with an OIDC token of relaybus-dlq-push, audience = the service URL
# (what Cloud Run IAM checks); the body is Pub/Sub's wrapped push JSON, whose
# attributes carry CloudPubSubDeadLetterSourceSubscription and the delivery
# attempts (https://cloud.google.com/pubsub/docs/push,
# https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions).
# dlqreplay acknowledges with 2xx once the letter is archived (idempotent on
# the message id); anything else is redelivered with the retry policy's
# backoff for the retention period. No dead-letter policy: a letter that
# cannot be archived stays here and the "archive backlog" alert fires.
resource "google_pubsub_subscription" "dead_letter_monitor" {
  for_each                   = local.pubsub_topics
  name                       = each.value.dead_letter_monitor
  topic                      = google_pubsub_topic.dead_letter[each.key].id
  ack_deadline_seconds       = local.defaults.ack_deadline_seconds
  message_retention_duration = "${each.value.message_retention_seconds}s"
  retain_acked_messages      = true

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  expiration_policy {
    ttl = ""
  }

  push_config {
    push_endpoint = "${google_cloud_run_v2_service.function["dlqreplay"].uri}/deadletters:archive"
    oidc_token {
      service_account_email = google_service_account.dead_letter_push.email
      # dlqreplay checks it (DLQREPLAY_AUDIENCE names this URL).
      audience = local.function_urls["dlqreplay"]
    }
  }

  depends_on = [time_sleep.function_invoker_propagation]
}

# The rollup topic: consume publishes the id of each event it handled.
resource "google_pubsub_topic" "rollup" {
  count      = local.on_pubsub ? 1 : 0
  name       = local.rollup.topic
  depends_on = [time_sleep.api_propagation, terraform_data.topology]
}

# The rollup subscription has no dead-letter topic on purpose: a notice for an
# event the relay has not recorded yet answers 409 and is redelivered until the
# relay heals the ledger (internal/ledger), for the whole retention.
resource "google_pubsub_subscription" "rollup" {
  count                      = local.on_pubsub && local.rollup.delivery == "push" ? 1 : 0
  name                       = local.rollup.subscription
  topic                      = google_pubsub_topic.rollup[0].id
  ack_deadline_seconds       = local.defaults.ack_deadline_seconds
  message_retention_duration = "604800s"

  retry_policy {
    minimum_backoff = "1s"
    maximum_backoff = "60s"
  }

  expiration_policy {
    ttl = ""
  }

  push_config {
    push_endpoint = google_cloud_run_v2_service.function["rollup"].uri
    oidc_token {
      service_account_email = google_service_account.function["rollup"].email
      audience              = google_cloud_run_v2_service.function["rollup"].uri
    }
  }

  depends_on = [time_sleep.function_invoker_propagation]
}

# One ordered push subscription per push consumer, delivering to its consume
# service with an OIDC token of the consumer's own service account (wrapped
# body: it carries deliveryAttempt). The filter is topology.Consumer.Filter:
# a replay or re-push addressed to another consumer never arrives here.
resource "google_pubsub_subscription" "consumer" {
  for_each                   = local.push_consumers
  name                       = each.value.subscription
  topic                      = google_pubsub_topic.topic[each.value.topic].id
  ack_deadline_seconds       = each.value.ack_deadline_seconds
  message_retention_duration = "${each.value.message_retention_seconds}s"
  retain_acked_messages      = true
  enable_message_ordering    = true
  filter                     = each.value.filter

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter[each.value.topic].id
    max_delivery_attempts = each.value.max_delivery_attempts
  }

  retry_policy {
    minimum_backoff = "${each.value.min_backoff_seconds}s"
    maximum_backoff = "${each.value.max_backoff_seconds}s"
  }

  expiration_policy {
    ttl = ""
  }

  push_config {
    push_endpoint = google_cloud_run_v2_service.consume[each.key].uri
    oidc_token {
      service_account_email = google_service_account.consume[each.key].email
      audience              = google_cloud_run_v2_service.consume[each.key].uri
    }
  }

  labels = {
    consumer = each.value.service
    handler  = replace(each.value.handler, ".", "_")
  }

  # Dead-lettering needs the service agent's grants before messages fail,
  # and delivery the consumer's invoker grant.
  depends_on = [
    google_pubsub_topic_iam_member.agent_dead_letter,
    time_sleep.iam_propagation,
    time_sleep.consume_invoker_propagation,
  ]

  # An operator pauses a consumer by detaching its push endpoint (dlqreplay
  # POST /consumers/<topic>/<consumer>:pause) and resumes it by setting the
  # same endpoint back (DLQREPLAY_PUSH_TARGETS, run.tf). A deploy must not
  # resume a paused consumer, so Terraform sets push_config when it creates
  # the subscription and leaves it to the operators after: the endpoint (the
  # consume service's URL) and identity do not change for a subscription.
  lifecycle {
    ignore_changes = [push_config]
  }
}
