# Cloud Scheduler jobs, authenticated with OIDC as the scheduler account.

# Drains the outbox on the topology's cadence. The relay stops after its time
# budget (RELAY_TIME_BUDGET), well inside the attempt deadline; a failed run
# is not retried by Scheduler because the next tick is the retry.
resource "google_cloud_scheduler_job" "relay" {
  name             = "relaybus-relay"
  region           = var.region
  description      = "Drain the relaybus outbox to Pub/Sub."
  schedule         = local.relay.schedule
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${local.relay.attempt_deadline_seconds}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloud_run_v2_service.function["relay"].uri
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.function["relay"].uri
    }
  }

  lifecycle {
    precondition {
      condition     = local.relay.attempt_deadline_seconds > local.relay.time_budget_seconds
      error_message = "relay.attempt_deadline_seconds must be above relay.time_budget_seconds, or Scheduler gives up on a relay still draining."
    }
  }

  # The relay takes each event's expected consumers from topic_consumers.
  depends_on = [terraform_data.sync_consumers, google_cloud_run_v2_service_iam_member.scheduler_invoker]
}

# The ledger's expiry sweep: events nobody reports on become EXPIRED.
resource "google_cloud_scheduler_job" "expire" {
  name             = "relaybus-expire"
  region           = var.region
  description      = "Expire relaybus ledger events past their expireAt (rollup POST /expire)."
  schedule         = var.expire_schedule
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "120s"

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.function["rollup"].uri}/expire"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.function["rollup"].uri
    }
  }

  depends_on = [google_cloud_run_v2_service_iam_member.scheduler_invoker]
}

# Archives new dead letters every minute (visible within a minute).
resource "google_cloud_scheduler_job" "dead_letter_archive" {
  count            = var.dlqreplay_settings.archive_path == null ? 0 : 1
  name             = "relaybus-dead-letter-archive"
  region           = var.region
  description      = "Archive new relaybus dead letters into the ledger (dlqreplay)."
  schedule         = "* * * * *"
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "120s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.function["dlqreplay"].uri}${var.dlqreplay_settings.archive_path}"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.function["dlqreplay"].uri
    }
  }

  depends_on = [google_cloud_run_v2_service_iam_member.scheduler_invoker]
}
