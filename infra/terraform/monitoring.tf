# Log-based metrics and alert policies (docs/telemetry.md "The dashboard and the alerts").
#
# The log-based metrics read the relay's JSON log lines (internal/logging:
# jsonPayload.message, severity). The messages are the relay's own strings;
# infra/services_test.go fails if shared/relay stops logging them.
#   "relay: drain"                           INFO (ERROR when the drain failed), fields remaining, failed, ...
#   "relay: publish failed; retry scheduled" WARNING, one per failed publish
#   "relay: event failed"                    ERROR, an event that reached max attempts (FAILED)
# publish's fast path runs the same relay code, so publish's lines count too.
#
# Aligners must suit the metric's kind and value type, or the Monitoring API
# refuses the policy (400). From the Aggregation reference
# (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#Aligner):
# ALIGN_COUNT, ALIGN_MAX and ALIGN_MEAN take numeric (or Boolean) values only;
# ALIGN_SUM takes numeric and distribution values; ALIGN_PERCENTILE_* takes
# distribution values and yields a DOUBLE gauge; ALIGN_RATE takes DELTA or
# CUMULATIVE numeric values. infra/monitoring_test.go checks every condition
# against the kind and type of the metric it reads.
#
# A log-based metric created in the same apply as the policy that reads it is
# not visible to Monitoring at once ("Cannot find metric(s)...", provider issue
# https://github.com/hashicorp/terraform-provider-google/issues/11102): the
# policies wait for time_sleep.log_metrics, which runs only when a metric is
# created or replaced. Monitoring's own error says a new metric "could take
# up to 10 minutes to become available", so the wait is 11 minutes by default
# and var.propagation_waits refuses less than 10 (infra/ops_test.go).

locals {
  # Every consume service (their Cloud Run names start with consume-).
  consume_log_filter = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "resource.labels.service_name=~\"^consume-\"",
  ])

  relay_log_filter = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "resource.labels.service_name=(\"relaybus-relay\" OR \"relaybus-publish\")",
  ])

  # Every service that publishes outbox rows: the relay, publish's fast
  # path, and each consume service's kick of its child events (a relay of
  # its own database): a kick that fails must reach the publish-failure
  # alert too.
  publisher_log_filter = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "resource.labels.service_name=~\"^(relaybus-relay|relaybus-publish|consume-.*)$\"",
  ])

  # Every consumer subscription id as Pub/Sub names it (eventarc.tf).
  subscription_filter     = "resource.type = \"pubsub_subscription\" AND resource.label.subscription_id = one_of(${join(", ", [for s in values(local.consumer_subscription_ids) : "\"${s}\""])})"
  dead_letter_monitor_ids = [for k, s in google_pubsub_subscription.dead_letter_monitor : s.name]
  monitor_filter          = "resource.type = \"pubsub_subscription\" AND resource.label.subscription_id = one_of(${join(", ", [for s in local.dead_letter_monitor_ids : "\"${s}\""])})"
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

  # Logging must be enabled first (main.tf).
  depends_on = [time_sleep.api_propagation]
}

# One count per relay drain (any database): its absence means the Scheduler
# jobs or the relay stopped. A counter, so the absence condition can use a
# numeric aligner (outbox_backlog is a distribution).
resource "google_logging_metric" "relay_drains" {
  name        = "relaybus/relay_drains"
  description = "Relay drains (one \"relay: drain\" line each)."
  filter      = "${local.relay_log_filter} AND jsonPayload.message=\"relay: drain\""

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  # Logging must be enabled first (main.tf).
  depends_on = [time_sleep.api_propagation]
}

# outbox_publish_error_total: one line per failed publish (retried or final).
resource "google_logging_metric" "publish_failures" {
  name        = "relaybus/outbox_publish_failures"
  description = "Failed publishes of outbox events (relay, publish's fast path, consume's child-event kicks)."
  filter      = "${local.publisher_log_filter} AND jsonPayload.message=(\"relay: publish failed; retry scheduled\" OR \"relay: event failed\")"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  # Logging must be enabled first (main.tf).
  depends_on = [time_sleep.api_propagation]
}

# outbox_max_delivery_attempts: events the relay gave up on (status FAILED).
resource "google_logging_metric" "events_failed" {
  name        = "relaybus/outbox_events_failed"
  description = "Outbox events that reached the relay's max attempts and were marked FAILED."
  filter      = "${local.publisher_log_filter} AND severity=ERROR AND jsonPayload.message=\"relay: event failed\""

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  # Logging must be enabled first (main.tf).
  depends_on = [time_sleep.api_propagation]
}

# A strict consumer's version gap open past its gap_timeout_seconds: one
# ERROR line per gap, "consume: version gap past its time" (shared/projection's
# resequencer, consume's POST /gaps:check; infra/services_test.go fails if it
# stops logging it), with consumer_id, aggregate_id and missing_version.
resource "google_logging_metric" "strict_gaps_stalled" {
  name        = "relaybus/strict_gaps_stalled"
  description = "Version gaps of strict consumers reported past their gap timeout (one \"consume: version gap past its time\" line each)."
  filter      = "${local.consume_log_filter} AND severity=ERROR AND jsonPayload.message=\"consume: version gap past its time\""

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  # Logging must be enabled first (main.tf).
  depends_on = [time_sleep.api_propagation]
}

# A forward consumer's target down: its circuit breaker opened
# (shared/forward, WARNING "forward: circuit breaker open; deliveries held
# without spending their attempts", with consumer_id and reason), or, while the
# breaker keeps the consumer paused, consume's probe found the target still
# down (WARNING "consume: the breaker's probe found the target down; ...",
# every minute). infra/services_test.go fails if either stops being logged.
# Every Cloud Run service: the declared forward consumers' consume services
# and the forwarders service alike.
resource "google_logging_metric" "forward_breaker_down" {
  name        = "relaybus/forward_breaker_down"
  description = "Forward targets found down: a forward consumer's circuit breaker opened, or its probe found the target still down while the breaker keeps the consumer paused."
  filter      = "resource.type=\"cloud_run_revision\" AND severity=WARNING AND jsonPayload.message=~\"^(forward: circuit breaker open|consume: the breaker's probe found the target down)\""

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "consumer_id"
      value_type  = "STRING"
      description = "The forward consumer (a forwarder's name for the forwarders added at run time)."
    }
  }
  label_extractors = {
    consumer_id = "EXTRACT(jsonPayload.consumer_id)"
  }

  # Logging must be enabled first (main.tf).
  depends_on = [time_sleep.api_propagation]
}

resource "time_sleep" "log_metrics" {
  create_duration = var.propagation_waits.log_metrics
  triggers = {
    metrics = join(",", [
      google_logging_metric.outbox_backlog.id,
      google_logging_metric.relay_drains.id,
      google_logging_metric.publish_failures.id,
      google_logging_metric.events_failed.id,
      google_logging_metric.strict_gaps_stalled.id,
      google_logging_metric.forward_breaker_down.id,
    ])
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

# Dead letters. Every <topic>.dlq-monitor pushes to dlqreplay, which
# acknowledges a letter once it is archived: so a monitor's backlog is
# letters that could not be archived (dlqreplay failing), and its
# acknowledged pushes are the letters archived. Pub/Sub metrics
# (https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-pubsub):
# subscription/num_undelivered_messages (GAUGE INT64) and
# subscription/push_request_count (DELTA INT64, label response_class).
resource "google_monitoring_alert_policy" "dead_letters" {
  display_name          = "relaybus: dead letters"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "more than ${var.alerts.dead_letters_per_hour} dead letters archived in an hour"
    condition_threshold {
      filter          = "${local.monitor_filter} AND metric.type = \"pubsub.googleapis.com/subscription/push_request_count\" AND metric.label.response_class = \"ack\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.alerts.dead_letters_per_hour
      duration        = "0s"
      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  conditions {
    display_name = "dead letters not archived for ${var.alerts.archive_backlog_minutes} min (dlqreplay /deadletters:archive failing)"
    condition_threshold {
      filter          = "${local.monitor_filter} AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "${var.alerts.archive_backlog_minutes * 60}s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Dead letters need a person: `relaybus -gcloud-auth -url <dlqreplay URL> dlq ls`, `dlq show <id>`, fix the cause, then `dlq replay <id>` (reaches the failed consumer only). If letters are not being archived, read dlqreplay's logs for POST /deadletters:archive."
  }

  depends_on = [google_pubsub_subscription.dead_letter_monitor]
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
      filter   = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.relay_drains.name}\""
      duration = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "The outbox is not draining: check the relaybus-relay-<database> jobs in Cloud Scheduler, the relay's `relay: drain` log lines (error field), and Pub/Sub publish errors."
  }

  # The log-based metrics must be visible to Monitoring first (#11102).
  depends_on = [time_sleep.log_metrics]
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

  # The log-based metrics must be visible to Monitoring first (#11102).
  depends_on = [time_sleep.log_metrics]
}

resource "google_monitoring_alert_policy" "strict_gaps" {
  display_name          = "relaybus: strict consumer gap past its time"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "a version gap open longer than its consumer's gap timeout"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.strict_gaps_stalled.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A strict consumer holds events behind a version that has not arrived. Through dlqreplay (the consume services are internal-only, operators cannot reach them): `relaybus -url <dlqreplay URL> -gcloud-auth gaps ls <topic> <consumer>` (GET /consumers/<topic>/<consumer>/gaps) lists the gaps (aggregate, missing version). Deliver the missing version again (`relaybus dlq replay <id>`, or `relaybus repush --consumer <consumer> <eventId>`) or skip it with `relaybus gaps skip --aggregate <id> --version <n> <topic> <consumer>` (POST .../gaps:skip, audited); the consumer applies the parked events in order at its next /gaps:check. See docs/strict-ordering.md (Releasing a gap) in the relaybus repository."
  }

  # The log-based metrics must be visible to Monitoring first (#11102).
  depends_on = [time_sleep.log_metrics]
}

# A forward target down: its consumer's circuit breaker opened, or the
# breaker's probe found it still down, within the last 5 minutes (the probe
# runs every minute while the breaker keeps the consumer paused, so the
# alert stays open for the whole outage and closes once the target answers).
resource "google_monitoring_alert_policy" "forward_breaker" {
  display_name          = "relaybus: forward target down (circuit breaker)"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "a forward consumer's breaker opened, or its probe found the target down"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.forward_breaker_down.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.consumer_id"]
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A forward consumer's target is down (the incident's metric label consumer_id names the consumer; the logs say why: \"forward: circuit breaker open\", with the reason). Its circuit breaker paused the consumer: an ordered push consumer or a forwarder has its subscription's push endpoint detached, an Eventarc consumer keeps its deliveries in its database; no delivery attempt is spent and nothing is dead-lettered, however long the outage. Fix the target; within a minute of it answering, the breaker's probe resumes the consumer and every waiting event is delivered. `relaybus -url <dlqreplay URL> -gcloud-auth consumers ls` shows it paused by breaker; `relaybus consumers pause <topic> <consumer>` takes the pause over (the probe then leaves it paused), and `relaybus consumers resume <topic> <consumer>` resumes it at once. See docs/forwarding.md (The circuit breaker) in the relaybus repository."
  }

  # The log-based metrics must be visible to Monitoring first (#11102).
  depends_on = [time_sleep.log_metrics]
}

# The delivery dashboard: what Pub/Sub says of every consumer subscription
# (a panel per subscription health signal). Built-in Pub/Sub metrics, read with
# Monitoring filters (https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-pubsub):
# undelivered messages and the oldest unacked message's age per consumer,
# push responses by class (delivery health: ack, or the 4xx/5xx that will
# be redelivered), messages dead-lettered, and the dead-letter monitors'
# backlog (letters not yet archived). Zero tile positions are left out, as
# for the relaybus dashboard (#16173).
locals {
  delivery_charts = [
    { title = "Undelivered messages per consumer", metric = "pubsub.googleapis.com/subscription/num_undelivered_messages", filter = local.subscription_filter, aligner = "ALIGN_MAX", by = ["resource.label.subscription_id"] },
    { title = "Oldest unacked message age per consumer (s)", metric = "pubsub.googleapis.com/subscription/oldest_unacked_message_age", filter = local.subscription_filter, aligner = "ALIGN_MAX", by = ["resource.label.subscription_id"] },
    { title = "Push deliveries/s by response class", metric = "pubsub.googleapis.com/subscription/push_request_count", filter = local.subscription_filter, aligner = "ALIGN_RATE", by = ["resource.label.subscription_id", "metric.label.response_class"] },
    { title = "Messages dead-lettered/s per consumer", metric = "pubsub.googleapis.com/subscription/dead_letter_message_count", filter = local.subscription_filter, aligner = "ALIGN_RATE", by = ["resource.label.subscription_id"] },
    { title = "Dead letters waiting to be archived", metric = "pubsub.googleapis.com/subscription/num_undelivered_messages", filter = local.monitor_filter, aligner = "ALIGN_MAX", by = ["resource.label.subscription_id"] },
  ]
}

resource "google_monitoring_dashboard" "delivery" {
  dashboard_json = jsonencode({
    displayName = "relaybus: delivery"
    mosaicLayout = {
      columns = 12
      tiles = [for i, c in local.delivery_charts : merge(
        { for k, v in { xPos = (i % 2) * 6, yPos = floor(i / 2) * 4 } : k => v if v != 0 },
        {
          width  = 6
          height = 4
          widget = {
            title = c.title
            xyChart = {
              dataSets = [{
                plotType = "LINE"
                timeSeriesQuery = {
                  timeSeriesFilter = {
                    filter = "${c.filter} AND metric.type = \"${c.metric}\""
                    aggregation = {
                      alignmentPeriod    = "60s"
                      perSeriesAligner   = c.aligner
                      crossSeriesReducer = "REDUCE_SUM"
                      groupByFields      = c.by
                    }
                  }
                }
              }]
            }
          }
        },
      )]
    }
  })

  depends_on = [time_sleep.api_propagation, google_pubsub_subscription.dead_letter_monitor]
}
