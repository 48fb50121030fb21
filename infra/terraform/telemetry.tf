# OpenTelemetry: the functions export traces and metrics in OTLP to Google's
# Telemetry API, telemetry.googleapis.com (internal/otelsetup: on Cloud Run with
# GOOGLE_CLOUD_PROJECT set and no OTEL_EXPORTER_OTLP_ENDPOINT,
# TELEMETRY_EXPORT=auto exports there; Google's
# recommended path for OpenTelemetry SDKs,
# https://cloud.google.com/trace/docs/migrate-to-otlp-endpoints). Traces land
# in Cloud Trace; metrics land in Cloud Monitoring with the Prometheus mapping
# (https://cloud.google.com/stackdriver/docs/reference/telemetry/v1.metrics),
# so the dashboard and the alert below read them with PromQL, their names
# quoted as PromQL's UTF-8 syntax asks (https://cloud.google.com/monitoring/promql):
# a histogram h is read as {"h_bucket"}, {"h_count"}, {"h_sum"}.
#
# infra/telemetry_test.go fails if a metric the dashboard or the alert reads is
# not one internal/telemetry records.

variable "telemetry" {
  type = object({
    # TELEMETRY_EXPORT of every function (relaybus's own setting): auto
    # exports to telemetry.googleapis.com on Cloud Run; off turns telemetry
    # off (and grants nothing).
    export = optional(string, "auto")
    # OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG. relaybus (relaybus's
    # own sampler) decides at each root by trace id at sample_ratio and
    # ignores the sampled flag Cloud Run sets on about 0.1 request/s per
    # instance; deliveries follow their producer. Any of the
    # specification's samplers may be named instead (docs/telemetry.md).
    sampler      = optional(string, "relaybus")
    sample_ratio = optional(number, 0.01)
    # OTEL_METRIC_EXPORT_INTERVAL, in seconds here (the variable is in
    # milliseconds). Cloud Monitoring takes a point per series at most
    # every 5 s.
    metric_interval_seconds = optional(number, 60)
    # The end-to-end objective: p99 of relaybus.hop.duration{hop=end_to_end}
    # (occurredAt → the consumer's commit) in seconds, over 5 minutes, and how
    # long it must be missed before the alert opens.
    end_to_end_p99_seconds = optional(number, 10)
    alert_duration         = optional(string, "600s")
    # The projection alert: p99 of relaybus.projection.version_lag (the
    # conventions' threshold: more than 10 versions).
    projection_lag_versions = optional(number, 10)
    # The forward breaker alert: how long a forward consumer's circuit
    # breaker may stay open or half-open (its target down) before it opens.
    breaker_open_duration = optional(string, "300s")
  })
  description = "OpenTelemetry: export (auto or off), the sampler and its ratio, the metric export interval in seconds, and the alerts' thresholds (end-to-end p99 in seconds, projection version lag)."
  default     = {}
  validation {
    condition = (contains(["auto", "google", "off"], var.telemetry.export) && var.telemetry.sample_ratio >= 0 && var.telemetry.sample_ratio <= 1 &&
      contains(["relaybus", "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"], var.telemetry.sampler) &&
    var.telemetry.metric_interval_seconds >= 5 && var.telemetry.end_to_end_p99_seconds > 0)
    error_message = "telemetry: export must be auto, google or off; sampler relaybus or one of the specification's (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio); sample_ratio within [0, 1]; metric_interval_seconds at least 5 (Cloud Monitoring's least interval per series); end_to_end_p99_seconds positive."
  }
}

resource "google_project_service" "telemetry" {
  for_each           = toset(["telemetry.googleapis.com", "cloudtrace.googleapis.com"])
  service            = each.key
  disable_on_destroy = false
}

locals {
  # Whether the functions export at all (TELEMETRY_EXPORT off: no grant).
  telemetry_exports = var.telemetry.export != "off"

  # Every function that exports: the five functions' accounts (consume's
  # are per consumer, below). rollup exports the ledger hop and its fold
  # spans, dlqreplay the forced replay and re-push spans.
  telemetry_functions = local.telemetry_exports ? toset(["publish", "relay", "rollup", "dlqreplay"]) : toset([])
  telemetry_consumers = local.telemetry_exports ? local.consumers : {}
}

# Writing traces (roles/cloudtrace.agent: telemetry.traces.write) and metrics
# (roles/monitoring.metricWriter: telemetry.metrics.write) through the
# Telemetry API, for every function that records them.
resource "google_project_iam_member" "telemetry_trace_writer" {
  for_each = local.telemetry_functions
  project  = var.project_id
  role     = "roles/cloudtrace.agent"
  member   = google_service_account.function[each.key].member
}

resource "google_project_iam_member" "telemetry_metric_writer" {
  for_each = local.telemetry_functions
  project  = var.project_id
  role     = "roles/monitoring.metricWriter"
  member   = google_service_account.function[each.key].member
}

# The exporter names the project as its quota project (x-goog-user-project,
# internal/otelsetup), and Google's Telemetry API then requires
# serviceusage.services.use on that project from the sending account
# (roles/serviceusage.serviceUsageConsumer; "Authorize the collector service
# account" in https://cloud.google.com/trace/docs/migrate-to-otlp-endpoints).
# Without it every export is refused with PERMISSION_DENIED.
resource "google_project_iam_member" "telemetry_quota_user" {
  for_each = local.telemetry_functions
  project  = var.project_id
  role     = "roles/serviceusage.serviceUsageConsumer"
  member   = google_service_account.function[each.key].member
}

resource "google_project_iam_member" "consume_telemetry_trace_writer" {
  for_each = local.telemetry_consumers
  project  = var.project_id
  role     = "roles/cloudtrace.agent"
  member   = google_service_account.consume[each.key].member
}

resource "google_project_iam_member" "consume_telemetry_metric_writer" {
  for_each = local.telemetry_consumers
  project  = var.project_id
  role     = "roles/monitoring.metricWriter"
  member   = google_service_account.consume[each.key].member
}

resource "google_project_iam_member" "consume_telemetry_quota_user" {
  for_each = local.telemetry_consumers
  project  = var.project_id
  role     = "roles/serviceusage.serviceUsageConsumer"
  member   = google_service_account.consume[each.key].member
}

locals {
  # PromQL of the dashboard's charts and the alert, by panel.
  telemetry_promql = {
    publish_rate         = "sum by (\"http.response.status_code\") (rate({\"relaybus.publish.request.duration_count\"}[5m]))"
    publish_p50          = "histogram_quantile(0.5, sum by (le) (rate({\"relaybus.publish.request.duration_bucket\"}[5m])))"
    publish_p99          = "histogram_quantile(0.99, sum by (le) (rate({\"relaybus.publish.request.duration_bucket\"}[5m])))"
    sent_rate            = "sum by (\"messaging.destination.name\", \"error.type\") (rate({\"messaging.client.sent.messages\"}[5m]))"
    pubsub_publish_p99   = "histogram_quantile(0.99, sum by (le, \"messaging.destination.name\") (rate({\"messaging.client.operation.duration_bucket\"}[5m])))"
    outbox_oldest        = "max by (\"relaybus.database\") ({\"relaybus.outbox.oldest_pending.age\"})"
    outbox_backlog       = "max by (\"relaybus.database\", \"relaybus.state\") ({\"relaybus.outbox.pending\"})"
    hop_p50              = "histogram_quantile(0.5, sum by (le, \"relaybus.hop\") (rate({\"relaybus.hop.duration_bucket\"}[5m])))"
    hop_p99              = "histogram_quantile(0.99, sum by (le, \"relaybus.hop\") (rate({\"relaybus.hop.duration_bucket\"}[5m])))"
    consume_outcomes     = "sum by (\"relaybus.consumer\", \"relaybus.outcome\") (rate({\"messaging.client.consumed.messages\"}[5m]))"
    nack_ratio           = "sum by (\"relaybus.consumer\") (rate({\"messaging.client.consumed.messages\", \"relaybus.outcome\"=~\"retry|dead_lettered|unavailable\"}[5m])) / sum by (\"relaybus.consumer\") (rate({\"messaging.client.consumed.messages\"}[5m]))"
    process_p50          = "histogram_quantile(0.5, sum by (le, \"relaybus.consumer\") (rate({\"messaging.process.duration_bucket\"}[5m])))"
    process_p95          = "histogram_quantile(0.95, sum by (le, \"relaybus.consumer\") (rate({\"messaging.process.duration_bucket\"}[5m])))"
    dead_letters         = "sum by (\"relaybus.consumer\", \"relaybus.outcome\") (increase({\"messaging.client.consumed.messages\", \"relaybus.outcome\"=~\"poison|dead_lettered\"}[1h]))"
    aggregate_id_invalid = "sum by (\"messaging.destination.name\", \"relaybus.reason\") (increase({\"relaybus.aggregate_id.invalid\"}[1h]))"
    aggregate_id_source  = "sum by (\"relaybus.aggregate_id.source\") (rate({\"relaybus.aggregate_id.source\"}[5m]))"
    strict_oldest_gap    = "max by (\"relaybus.consumer\") ({\"relaybus.strict.oldest_gap.age\"})"
    strict_open_gaps     = "max by (\"relaybus.consumer\") ({\"relaybus.strict.open_gaps\"})"
    projection_lag_p99   = "histogram_quantile(0.99, sum by (le, \"relaybus.consumer\") (rate({\"relaybus.projection.version_lag_bucket\"}[5m])))"
    projection_stale     = "sum by (\"relaybus.consumer\") (rate({\"relaybus.projection.stale\"}[5m]))"
    breaker_state        = "max by (\"relaybus.consumer\") ({\"relaybus.forward.breaker.state\"})"
    end_to_end_p99       = "histogram_quantile(0.99, sum by (le) (rate({\"relaybus.hop.duration_bucket\", \"relaybus.hop\"=\"end_to_end\"}[5m])))"
  }

  # One chart per signal an operator watches (docs/telemetry.md "The dashboard and the alerts").
  telemetry_charts = [
    { title = "Publish requests/s by status", queries = ["publish_rate"] },
    { title = "Publish latency p50 / p99 (s)", queries = ["publish_p50", "publish_p99"] },
    { title = "Relay: messages published/s by topic", queries = ["sent_rate"] },
    { title = "Relay: Pub/Sub publish p99 (s)", queries = ["pubsub_publish_p99"] },
    { title = "Outbox: oldest unpublished row (s)", queries = ["outbox_oldest"] },
    { title = "Outbox: backlog by state", queries = ["outbox_backlog"] },
    { title = "Per-hop latency p50 / p99 (s)", queries = ["hop_p50", "hop_p99"] },
    { title = "Consume outcomes/s", queries = ["consume_outcomes"] },
    { title = "Consume nack ratio", queries = ["nack_ratio"] },
    { title = "Processing p50 / p95 (s)", queries = ["process_p50", "process_p95"] },
    { title = "Dead letters per hour", queries = ["dead_letters"] },
    { title = "Aggregate ids: refused per hour / sources", queries = ["aggregate_id_invalid", "aggregate_id_source"] },
    { title = "Strict consumers: oldest open gap (s) / open gaps", queries = ["strict_oldest_gap", "strict_open_gaps"] },
    { title = "Projection version lag p99 (versions jumped) / stale events/s", queries = ["projection_lag_p99", "projection_stale"] },
  ]
}

# Tile positions: Cloud Monitoring leaves zero-valued fields out of the
# dashboard it returns, so a tile written with xPos = 0 or yPos = 0 differs
# from what the provider reads back and every plan wants to update the
# dashboard (hashicorp/terraform-provider-google#16173). A position of 0 is
# therefore left out, as the API would (infra/telemetry_test.go).
resource "google_monitoring_dashboard" "relaybus" {
  dashboard_json = jsonencode({
    displayName = "relaybus"
    mosaicLayout = {
      columns = 12
      tiles = [for i, c in local.telemetry_charts : merge(
        { for k, v in { xPos = (i % 2) * 6, yPos = floor(i / 2) * 4 } : k => v if v != 0 },
        {
          width  = 6
          height = 4
          widget = {
            title = c.title
            xyChart = {
              dataSets = [for q in c.queries : {
                plotType        = "LINE"
                legendTemplate  = q
                timeSeriesQuery = { prometheusQuery = local.telemetry_promql[q] }
              }]
            }
          }
        },
      )]
    }
  })

  depends_on = [time_sleep.api_propagation]
}

# PromQL conditions over relaybus's own metrics. Cloud Monitoring refuses a
# PromQL condition whose metric does not exist yet unless metric validation
# is off (PrometheusQueryLanguageCondition.disableMetricValidation; provider
# 6.13.0 and later, hashicorp/terraform-provider-google#20491). On a fresh
# project no event has been sent when these are created, and with export
# off none ever is, so the apply would fail: validation is off, and the
# queries are checked against the metrics the code records by
# infra/telemetry_test.go instead.
resource "google_monitoring_alert_policy" "end_to_end_latency" {
  display_name          = "relaybus: end-to-end latency p99"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "p99 from occurredAt to the consumer's commit over ${var.telemetry.end_to_end_p99_seconds}s"
    condition_prometheus_query_language {
      query                     = "${local.telemetry_promql.end_to_end_p99} > ${var.telemetry.end_to_end_p99_seconds}"
      duration                  = var.telemetry.alert_duration
      disable_metric_validation = true
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Events take longer than the objective from occurrence to their consumers. The dashboard \"relaybus\" shows which hop (relaybus.hop: enqueue_to_publish, publish_to_consume) grew; Cloud Trace shows single events (sampled by OTEL_TRACES_SAMPLER, see docs/telemetry.md)."
  }

  depends_on = [time_sleep.api_propagation]
}

# The projection alert: a state projection's version lag above 10
# (relaybus.projection.version_lag: the versions it jumped over when it
# applied an event), as p99 over 5 minutes per consumer.
resource "google_monitoring_alert_policy" "projection_version_lag" {
  display_name          = "relaybus: projection version lag"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "p99 of a projection's version lag over ${var.telemetry.projection_lag_versions} versions"
    condition_prometheus_query_language {
      query                     = "${local.telemetry_promql.projection_lag_p99} > ${var.telemetry.projection_lag_versions}"
      duration                  = var.telemetry.alert_duration
      disable_metric_validation = true
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A state projection applies events that skip versions: deliveries reordered (Eventarc, a re-push), versions dead-lettered or failed at that consumer. `relaybus -url <dlqreplay URL> -gcloud-auth dlq ls --consumer <consumer>` lists what it missed; replay it to that consumer only."
  }

  depends_on = [time_sleep.api_propagation]
}

# The forward breaker alert: a forward consumer's circuit breaker open or
# half-open (relaybus.forward.breaker.state at 1 or more: its target down,
# deliveries held without spending their attempts) for
# var.telemetry.breaker_open_duration.
resource "google_monitoring_alert_policy" "forward_breaker_open" {
  display_name          = "relaybus: forward target down (circuit breaker open)"
  combiner              = "OR"
  notification_channels = var.alerts.notification_channels

  conditions {
    display_name = "a forward consumer's breaker open or half-open for ${var.telemetry.breaker_open_duration}"
    condition_prometheus_query_language {
      query                     = "${local.telemetry_promql.breaker_state} >= 1"
      duration                  = var.telemetry.breaker_open_duration
      disable_metric_validation = true
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A forward consumer's target has been down for a while: its circuit breaker holds the deliveries back and pauses the consumer (a pull worker stops pulling; an ordered push consumer or a forwarder has its push endpoint detached; an Eventarc consumer keeps its deliveries in its database), so no delivery attempt is spent and nothing is dead-lettered (docs/forwarding.md). The consume service's logs say why (\"forward: circuit breaker open\", with the reason); fix the target, and the next probe closes the breaker and resumes the consumer."
  }

  depends_on = [time_sleep.api_propagation]
}
