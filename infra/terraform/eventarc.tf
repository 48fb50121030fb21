# Eventarc delivery (delivery: eventarc in the topology): a Pub/Sub trigger on
# the consumer's topic, delivering the messagePublished CloudEvent to its
# consume service as the consumer's service account.
#
# What Eventarc does not give, and how relaybus covers it:
#   - No transport ordering. The trigger creates its own subscription without
#     message ordering, and ordering cannot be switched on afterwards. The
#     consumer's version gate keeps per-aggregate order (a projection takes only
#     newer versions; a strict handler takes only version = last + 1 and asks
#     for redelivery otherwise).
#   - No filter. Pub/Sub filters are fixed at creation and Eventarc creates the
#     subscription without one, so a replay or re-push addressed to another
#     consumer (target_consumer) reaches this one too: consume must acknowledge
#     and skip a message whose target_consumer names another consumer.
#   - No dead-letter or retry policy in Terraform (hashicorp/terraform-provider-google
#     issue #17697): terraform_data.eventarc_subscription_policy sets them on the
#     trigger's subscription with gcloud after every apply (re-run on every
#     image tag, so a deploy always re-applies them), plus the ack deadline,
#     retention, acked-message retention (seek) and no expiry.
#   - A generated subscription name, eventarc-<region>-<trigger>-sub-<n>: it is
#     what Pub/Sub stamps on dead letters (CloudPubSubDeadLetterSourceSubscription)
#     and what seek and snapshots need. local.consumer_subscription_ids maps
#     every logical subscription id to the real one; dlqreplay reads it as
#     DLQREPLAY_SUBSCRIPTIONS and outputs.tf prints it.

locals {
  # Logical subscription id (<topic>.<service>-<role>) => the id Pub/Sub uses:
  # the same for push and pull consumers, the trigger's subscription for Eventarc ones
  # (transport[0].pubsub[0].subscription is projects/<p>/subscriptions/<id>).
  consumer_subscription_ids = merge(
    { for k, c in local.push_consumers : k => google_pubsub_subscription.consumer[k].name },
    { for k, c in local.eventarc_consumers : k => element(split("/", google_eventarc_trigger.consumer[k].transport[0].pubsub[0].subscription), 3) },
    { for k, c in local.pubsub_pull_consumers : k => google_pubsub_subscription.consumer_pull[k].name },
    # On NATS the durable consumer is named after the logical subscription.
    { for k, c in local.pull_consumers : k => c.subscription if local.on_nats },
  )
}

resource "google_eventarc_trigger" "consumer" {
  for_each        = local.eventarc_consumers
  name            = each.value.run_service
  location        = var.region
  service_account = google_service_account.consume[each.key].email

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.pubsub.topic.v1.messagePublished"
  }

  transport {
    pubsub {
      topic = google_pubsub_topic.topic[each.value.topic].id
    }
  }

  destination {
    cloud_run_service {
      service = google_cloud_run_v2_service.consume[each.key].name
      region  = var.region
    }
  }

  labels = {
    consumer = each.value.service
  }

  # The Eventarc service agent's role and the Pub/Sub agent's token grants
  # (iam_propagation), and the consumer's invoker grant, must have
  # propagated: a fresh project's first trigger fails otherwise (provider
  # issue https://github.com/hashicorp/terraform-provider-google/issues/14584).
  depends_on = [
    time_sleep.iam_propagation,
    time_sleep.consume_invoker_propagation,
  ]
}

resource "terraform_data" "eventarc_subscription_policy" {
  for_each = local.eventarc_consumers

  # Re-applied on every deploy (a new image tag) and whenever a setting or the
  # trigger's subscription changes.
  triggers_replace = [
    var.image_tag,
    google_eventarc_trigger.consumer[each.key].transport[0].pubsub[0].subscription,
    each.value.max_delivery_attempts,
    each.value.min_backoff_seconds,
    each.value.max_backoff_seconds,
    each.value.ack_deadline_seconds,
    each.value.message_retention_seconds,
  ]

  provisioner "local-exec" {
    command = join(" ", [for a in [
      var.gcloud, "pubsub", "subscriptions", "update",
      google_eventarc_trigger.consumer[each.key].transport[0].pubsub[0].subscription,
      "--project=${var.project_id}",
      "--dead-letter-topic=${google_pubsub_topic.dead_letter[each.value.topic].id}",
      "--max-delivery-attempts=${each.value.max_delivery_attempts}",
      "--min-retry-delay=${each.value.min_backoff_seconds}s",
      "--max-retry-delay=${each.value.max_backoff_seconds}s",
      "--ack-deadline=${each.value.ack_deadline_seconds}",
      "--message-retention-duration=${each.value.message_retention_seconds}s",
      "--retain-acked-messages",
      "--expiration-period=never",
    ] : "'${replace(a, "'", "'\\''")}'"])
  }

  depends_on = [
    google_pubsub_topic_iam_member.agent_dead_letter,
    google_pubsub_subscription_iam_member.agent_eventarc,
  ]
}

# The rollup topic by Eventarc (rollup.delivery: eventarc): no dead-letter
# topic (see pubsub.tf), only the retry policy.
resource "google_eventarc_trigger" "rollup" {
  count           = local.on_pubsub && local.rollup.delivery == "eventarc" ? 1 : 0
  name            = "relaybus-rollup"
  location        = var.region
  service_account = google_service_account.function["rollup"].email

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.pubsub.topic.v1.messagePublished"
  }

  transport {
    pubsub {
      topic = google_pubsub_topic.rollup[0].id
    }
  }

  destination {
    cloud_run_service {
      service = google_cloud_run_v2_service.function["rollup"].name
      region  = var.region
    }
  }

  depends_on = [time_sleep.iam_propagation, time_sleep.function_invoker_propagation]
}

resource "terraform_data" "eventarc_rollup_policy" {
  count            = local.on_pubsub && local.rollup.delivery == "eventarc" ? 1 : 0
  triggers_replace = [var.image_tag, google_eventarc_trigger.rollup[0].transport[0].pubsub[0].subscription]

  provisioner "local-exec" {
    command = join(" ", [for a in [
      var.gcloud, "pubsub", "subscriptions", "update",
      google_eventarc_trigger.rollup[0].transport[0].pubsub[0].subscription,
      "--project=${var.project_id}",
      "--min-retry-delay=1s",
      "--max-retry-delay=60s",
      "--message-retention-duration=7d",
      "--expiration-period=never",
    ] : "'${replace(a, "'", "'\\''")}'"])
  }
}
