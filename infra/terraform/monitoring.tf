# Log-based metrics and alert policies (pubsub-conventions.md §10).
#
# The log-based metrics read the relay's JSON log lines (shared/logging:
# jsonPayload.message, severity). The messages are the relay's own strings;
# infra/infra_test.go fails if shared/relay stops logging them.
#   "relay: drain"                           INFO (ERROR when the drain failed), fields remaining, failed, ...
#   "relay: publish failed; retry scheduled" WARNING, one per failed publish
#   "relay: event failed"                    ERROR, an event that reached max attempts (FAILED)
# publish's fast path runs the same relay code, so publish's lines count too.

locals {
  relay_log_filter = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "resource.labels.service_name=(\"relaybus-relay\" OR \"relaybus-publish\")",
  ])

  # Every consumer subscription id: push subscriptions by name, Eventarc
  # triggers' generated subscriptions by their resource id.
  consumer_subscription_ids = concat(
    [for k, s in google_pubsub_subscription.consumer : s.name],
    [for k, t in google_eventarc_trigger.consumer : element(split("/", t.transport[0].pubsub[0].subscription), 3)],
  )
  dead_letter_monitor_ids = [for k, s in google_pubsub_subscription.dead_letter_monitor : s.name]
  subscription_filter     = "resource.type = \"pubsub_subscription\" AND resource.label.subscription_id = one_of(${join(", ", [for s in local.consumer_subscription_ids : "\"${s}\""])})"
}

# outbox_pending_count: the relay reports the outbox backlog after every drain.
resource "google_logging_metric" "outbox_backlog" {
  name            = "relaybus/outbox_backlog"
  description     = "Outbox rows waiting to be published, as reported by each relay drain (jsonPayload.remaining)."
  filter          = "${local.relay_log_filter} AND jsonPayload.message=\"relay: drain\""
  value_extractor = "EXTRACT(jsonPayload.remaining)"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "1"
  }

  bucket_options {
    exponential_buckets {
      num_finite_buckets = 32
      growth_factor      = 2
      scale              = 1
    }
  }
}

# outbox_publish_error_total: one line per failed publish (retried or final).
resource "google_logging_metric" "publish_failures" {
  name        = "relaybus/outbox_publish_failures"
  description = "Failed publishes of outbox events (relay and publish's fast path)."
  filter      = "${local.relay_log_filter} AND jsonPayload.message=(\"relay: publish failed; retry scheduled\" OR \"relay: event failed\")"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }
}

# outbox_max_delivery_attempts: events the relay gave up on (status FAILED).
resource "google_logging_metric" "events_failed" {
  name        = "relaybus/outbox_events_failed"
  description = "Outbox events that reached the relay's max attempts and were marked FAILED."
  filter      = "${local.relay_log_filter} AND severity=ERROR AND jsonPayload.message=\"relay: event failed\""

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }
}

resource "google_monitoring_alert_policy" "subscription_backlog" {
  display_name          = "relaybus: subscription backlog"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "undelivered messages > ${var.alerts.subscription_backlog} for 5 min"
    condition_threshold {
      filter          = "${local.subscription_filter} AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.subscription_backlog
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A consumer is falling behind. Check its consume service's errors (Cloud Run logs) and its ledger events (`relaybus events ls --status RETRYING`)."
  }
}

resource "google_monitoring_alert_policy" "oldest_unacked" {
  display_name          = "relaybus: oldest unacked message age"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "oldest unacked message older than ${var.alerts.oldest_unacked_age_seconds}s"
    condition_threshold {
      filter          = "${local.subscription_filter} AND metric.type = \"pubsub.googleapis.com/subscription/oldest_unacked_message_age\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.oldest_unacked_age_seconds
      duration        = "60s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A message has waited too long: a consumer keeps failing it (it will dead-letter after max attempts) or a strict consumer waits for a missing version."
  }
}

resource "google_monitoring_alert_policy" "dead_letters" {
  display_name          = "relaybus: dead letters"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "more than ${var.alerts.dead_letters} dead letters waiting in a <topic>.dlq-monitor"
    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND resource.label.subscription_id = one_of(${join(", ", [for s in local.dead_letter_monitor_ids : "\"${s}\""])}) AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.dead_letters
      duration        = "60s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  conditions {
    display_name = "more than ${var.alerts.dead_letters} messages dead-lettered by a consumer subscription in an hour"
    condition_threshold {
      filter          = "${local.subscription_filter} AND metric.type = \"pubsub.googleapis.com/subscription/dead_letter_message_count\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.dead_letters
      duration        = "0s"
      aggregations {
        alignment_period   = "3600s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Dead letters need a person: `relaybus dlq ls`, `relaybus dlq show <id>`, fix the cause, then `relaybus dlq replay <id>` (reaches the failed consumer only)."
  }
}

resource "google_monitoring_alert_policy" "outbox_backlog" {
  display_name          = "relaybus: outbox backlog"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "outbox backlog > ${var.alerts.outbox_backlog} for 5 min"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.outbox_backlog.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.outbox_backlog
      duration        = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_PERCENTILE_99"
        cross_series_reducer = "REDUCE_MAX"
      }
    }
  }

  # No drain reported for 5 minutes: Scheduler or the relay is not running.
  conditions {
    display_name = "no relay drain for 5 min"
    condition_absent {
      filter   = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.outbox_backlog.name}\""
      duration = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_COUNT"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "The outbox is not draining: check the relaybus-relay job in Cloud Scheduler, the relay's `relay: drain` log lines (error field), and Pub/Sub publish errors."
  }
}

resource "google_monitoring_alert_policy" "publish_failures" {
  display_name          = "relaybus: outbox publish failures"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "more than ${var.alerts.publish_failures_per_minute} failed publishes per minute for 5 min"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.publish_failures.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.publish_failures_per_minute / 60
      duration        = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_RATE"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  conditions {
    display_name = "an outbox event reached max attempts (FAILED)"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.events_failed.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "The relay cannot publish: see `relay: publish failed` / `relay: event failed` log lines (event_id, error). FAILED events can be re-pushed with `relaybus repush <id>` once the cause is fixed."
  }
}
