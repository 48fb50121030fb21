# Pull mode on Cloud Run (var.pull_mode; off by default). A pull consumer's
# consume service runs CONSUMER_MODE=pull: a long-running worker (internal/pull)
# that pulls its subscription with unary Pull and lease renewal into the same
# engine push reaches over HTTP, for consumers that push cannot reach or that
# want exactly-once delivery.
#
# Where it runs. Cloud Run offers two shapes for a pull workload today:
#   - a worker pool: no URL, no request-driven autoscaling, instances that run
#     until scaled down, billed for their lifetime
#     (https://cloud.google.com/run/docs/deploy-worker-pools); Terraform's
#     google_cloud_run_v2_worker_pool arrived in the google provider after
#     6.14.1 (magic-modules #13816, May 2025), and this configuration pins
#     6.14.1 (versions.tf: an upgrade is a reviewed change of its own);
#   - a service with minimum instances and instance-based billing
#     (https://cloud.google.com/run/docs/configuring/min-instances,
#     https://cloud.google.com/run/docs/configuring/billing-settings): CPU
#     stays allocated outside requests, so the worker runs between them.
# This file takes the second, on the pinned provider: the consume service of
# a pull consumer (run.tf) keeps pull_mode.min_instances instances up
# (min_instance_count), never throttles their CPU (cpu_idle = false), caps
# them at pull_mode.max_instances (1 by default: per-key order holds within
# one worker), and still serves the Scheduler's /ledger:ship, /inbox:purge
# and /gaps:check. Moving it to a worker pool is the same container and
# environment once the provider is bumped.
#
# The subscription is the push subscription's twin without push_config:
# ordered, filtered (a replay addressed to another consumer never arrives),
# the same dead-letter and retry policy (the worker dead-letters at
# CONSUMER_MAX_DELIVERY_ATTEMPTS itself; Pub/Sub's policy catches what a
# worker that keeps dying leaves behind). exactly_once_delivery turns on
# Pub/Sub's exactly-once delivery, which only pull subscriptions support
# ("Push and export subscriptions don't support exactly-once delivery",
# https://cloud.google.com/pubsub/docs/exactly-once-delivery): no redelivery
# while a message is outstanding or after a successful ack. The inbox still
# makes effects happen once whatever the subscription does.
resource "google_pubsub_subscription" "consumer_pull" {
  for_each                     = local.pubsub_pull_consumers
  name                         = each.value.subscription
  topic                        = google_pubsub_topic.topic[each.value.topic].id
  ack_deadline_seconds         = each.value.ack_deadline_seconds
  message_retention_duration   = "${each.value.message_retention_seconds}s"
  retain_acked_messages        = true
  enable_message_ordering      = true
  enable_exactly_once_delivery = var.pull_mode.exactly_once_delivery
  filter                       = each.value.filter

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

  labels = {
    consumer = each.value.service
    handler  = replace(each.value.handler, ".", "_")
    mode     = "pull"
  }

  depends_on = [
    google_pubsub_topic_iam_member.agent_dead_letter,
    time_sleep.iam_propagation,
  ]
}

# Switching a consumer to pull mode replaces its push subscription (or its
# Eventarc trigger and the trigger's own subscription) with a new pull
# subscription: the new one starts empty. docs/deploying.md ("Pull mode")
# is the switch without losing the backlog: a snapshot of the old
# subscription before the apply, a seek of the new one to it after.
#
# Who subscribes to a pull consumer's subscription (roles/pubsub.subscriber:
# pull, acknowledge, modify ack deadlines, seek): its consume service's own
# account, which pulls it; the Pub/Sub service agent, which acknowledges
# what it dead-letters on the source subscription; dlqreplay, which seeks
# it.
resource "google_pubsub_subscription_iam_member" "pull_consume" {
  for_each     = local.pubsub_pull_consumers
  subscription = google_pubsub_subscription.consumer_pull[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.consume[each.key].member
}

resource "google_pubsub_subscription_iam_member" "pull_agent" {
  for_each     = local.pubsub_pull_consumers
  subscription = google_pubsub_subscription.consumer_pull[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "pull_dlqreplay_seek" {
  for_each     = local.pubsub_pull_consumers
  subscription = google_pubsub_subscription.consumer_pull[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.function["dlqreplay"].member
}

# The grants above propagate like any IAM change (iam.tf): the consume
# services of pull consumers start after this wait, so their worker's
# first pull is not refused.
resource "time_sleep" "pull_grant_propagation" {
  create_duration = var.propagation_waits.iam
  triggers = {
    grants = sha1(jsonencode([
      [for g in google_pubsub_subscription_iam_member.pull_consume : g.id],
      [for g in google_pubsub_subscription_iam_member.pull_agent : g.id],
      [for g in google_pubsub_subscription_iam_member.pull_dlqreplay_seek : g.id],
    ]))
  }
}

locals {
  # PULL_MAX_IN_FLIGHT: deliveries a pull worker holds at once. Each one
  # runs a Postgres transaction, so by default as many as its pool has
  # connections; more would hold leases while they wait for one.
  pull_max_in_flight = coalesce(var.pull_mode.max_in_flight, var.cloud_sql.pool_max_conns)

  # pull_mode.consumers must name consumers of the topology (a typo would
  # leave a consumer on push without a word).
  pull_mode_errors = concat(
    [for n in var.pull_mode.consumers : "pull_mode.consumers: \"${n}\" is no consumer of the topology (subscription ids are <topic>.<service>-<role>: ${join(", ", sort(keys(local.consumers)))})" if !contains(keys(local.consumers), n)],
    local.pull_max_in_flight > var.cloud_sql.pool_max_conns ? ["pull_mode.max_in_flight ${local.pull_max_in_flight} is above cloud_sql.pool_max_conns ${var.cloud_sql.pool_max_conns}: deliveries beyond the pool hold their leases while they wait for a connection; lower it or raise the pool"] : [],
  )
}

# Refuses a plan whose pull mode names an unknown consumer or outruns its
# pool, before anything is created.
resource "terraform_data" "pull_mode" {
  input = { consumers = sort(keys(local.pull_consumers)), max_in_flight = local.pull_max_in_flight }

  lifecycle {
    precondition {
      condition     = length(local.pull_mode_errors) == 0
      error_message = join("; ", local.pull_mode_errors)
    }
  }
}
