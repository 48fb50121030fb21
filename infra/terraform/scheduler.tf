# Cloud Scheduler jobs: each a POST with an empty body, authenticated with an
# OIDC token of relaybus-scheduler whose audience is the service URL (what
# Cloud Run IAM checks). Each job's attempt deadline is above the time the
# called function may take (its Cloud Run request timeout, which bounds its
# own budget), so Scheduler never gives up on a call that is still working.
# HTTP targets accept attempt deadlines of 15 s to 30 min
# (https://registry.terraform.io/providers/hashicorp/google/6.14.1/docs/resources/cloud_scheduler_job).
# A failed run is not retried by Scheduler: the next tick is the retry, and
# every one of these calls is bounded and idempotent.
#
#   relay-<database>       the topology's relay.schedule   POST relay /?database=<name>
#   ledger-ship-<consumer> every minute                    POST consume /ledger:ship
#   inbox-purge-<consumer> daily                           POST consume /inbox:purge
#   gaps-check-<consumer>  every minute (strict consumers)  POST consume /gaps:check
#   breaker-probe-<consumer> every minute (forward push and Eventarc consumers) POST consume /breaker:probe
#   reconcile              every minute                    POST rollup /reconcile
#   expire                 hourly                          POST rollup /expire
#
# Consume services and the relay and rollup have internal-only ingress;
# Cloud Scheduler's requests count as internal
# (https://cloud.google.com/run/docs/securing/ingress).

locals {
  # Margin between a function's request timeout and the job's deadline.
  scheduler_deadline_margin_seconds = 30

  # Job names carry the consumer's Cloud Run service name (unique, short).
  consume_jobs = {
    for k, c in local.consumers : k => {
      name             = c.run_service
      attempt_deadline = min(1800, c.ack_deadline_seconds + local.scheduler_deadline_margin_seconds)
    }
  }
}

# Drains one database's outbox on the topology's cadence. The relay stops
# after its time budget (RELAY_TIME_BUDGET), well inside the attempt
# deadline, and answers a JSON summary (500 when the drain failed).
resource "google_cloud_scheduler_job" "relay" {
  for_each         = local.databases
  name             = "relaybus-relay-${each.key}"
  region           = var.region
  description      = "Drain the relaybus outbox of database ${each.key} to Pub/Sub (relay POST /?database=${each.key})."
  schedule         = local.relay.schedule
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${local.relay.attempt_deadline_seconds}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.function["relay"].uri}/?database=${each.key}"
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
    # Every database's drain fires on the same tick: the relay must have a
    # request slot for each, or Cloud Run refuses the surplus.
    precondition {
      condition     = var.relay_settings.max_instances * var.relay_settings.concurrency >= length(local.databases)
      error_message = "relay_settings.max_instances × relay_settings.concurrency must be at least the number of databases (${length(local.databases)}): one drain per database runs on every tick."
    }
  }

  # The relay takes each event's expected consumers from topic_consumers.
  depends_on = [terraform_data.sync_consumers, time_sleep.function_invoker_propagation]
}

# Ships the consumption attempts the ledger missed (a Firestore outage, a
# killed instance) from the consumer's Postgres to Firestore; bounded and
# idempotent.
resource "google_cloud_scheduler_job" "ledger_ship" {
  for_each         = local.consume_jobs
  name             = "relaybus-ledger-ship-${each.value.name}"
  region           = var.region
  description      = "Ship ${each.key}'s consumption attempts the ledger missed (consume POST /ledger:ship)."
  schedule         = var.schedules.ledger_ship
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${each.value.attempt_deadline}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.consume[each.key].uri}/ledger:ship"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.consume[each.key].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

# Deletes the consumer's inbox rows older than INBOX_RETENTION.
resource "google_cloud_scheduler_job" "inbox_purge" {
  for_each         = local.consume_jobs
  name             = "relaybus-inbox-purge-${each.value.name}"
  region           = var.region
  description      = "Purge ${each.key}'s inbox rows past INBOX_RETENTION (consume POST /inbox:purge)."
  schedule         = var.schedules.inbox_purge
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${each.value.attempt_deadline}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.consume[each.key].uri}/inbox:purge"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.consume[each.key].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

# A strict consumer's resequencer: applies parked events whose turn has come
# (their handler had failed) and reports version gaps open longer than the
# consumer's gap_timeout_seconds (an ERROR log, stalled attempts in the
# ledger); bounded and idempotent (each gap is reported once).
resource "google_cloud_scheduler_job" "gaps_check" {
  for_each         = { for k, j in local.consume_jobs : k => j if local.consumers[k].handler == "strict" }
  name             = "relaybus-gaps-check-${each.value.name}"
  region           = var.region
  description      = "Report ${each.key}'s version gaps past their time and apply parked events (consume POST /gaps:check)."
  schedule         = var.schedules.gaps_check
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${each.value.attempt_deadline}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.consume[each.key].uri}/gaps:check"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.consume[each.key].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

# A forward consumer delivered by ordered push or Eventarc: while its circuit
# breaker keeps it paused (the target is down), probe the target once the
# cool-down has passed and resume it when it answers: the push endpoint set
# back, or the consumer's flag lifted and its kept deliveries published again
# (docs/forwarding.md). Bounded (FORWARD_TIMEOUT and a few admin calls or
# statements) and idempotent; an operator's pause is left alone.
resource "google_cloud_scheduler_job" "breaker_probe" {
  for_each         = { for k, j in local.consume_jobs : k => j if contains(keys(local.breaker_probe_consumers), k) }
  name             = "relaybus-breaker-probe-${each.value.name}"
  region           = var.region
  description      = "Probe ${each.key}'s forward target while its circuit breaker keeps it paused, and resume it when the target answers (consume POST /breaker:probe)."
  schedule         = var.schedules.breaker_probe
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${each.value.attempt_deadline}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.consume[each.key].uri}/breaker:probe"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.consume[each.key].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

# Re-derives ledger statuses that are not final (bounded per call).
resource "google_cloud_scheduler_job" "reconcile" {
  name             = "relaybus-reconcile"
  region           = var.region
  description      = "Re-derive relaybus ledger statuses that are not final (rollup POST /reconcile)."
  schedule         = var.schedules.reconcile
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${local.functions.rollup.timeout_seconds + local.scheduler_deadline_margin_seconds}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.function["rollup"].uri}/reconcile"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.function["rollup"].uri
    }
  }

  depends_on = [time_sleep.function_invoker_propagation]
}

# The ledger's expiry sweep: events nobody reports on become EXPIRED.
resource "google_cloud_scheduler_job" "expire" {
  name             = "relaybus-expire"
  region           = var.region
  description      = "Expire relaybus ledger events past their expireAt (rollup POST /expire)."
  schedule         = var.schedules.expire
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${local.functions.rollup.timeout_seconds + local.scheduler_deadline_margin_seconds}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.function["rollup"].uri}/expire"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.function["rollup"].uri
    }
  }

  depends_on = [time_sleep.function_invoker_propagation]
}
