# Forward consumers added at run time (var.forwarders; off by default;
# docs/forwarding.md, "Forwarders added at run time").
#
# An operator adds, changes and removes a forwarder through dlqreplay's
# /forwarders (the API, `relaybus forwarders`, the console): dlqreplay writes
# its row in relaybus_inbox_forwarders and creates its ordered subscription
# <topic>.<name>-forwarder, which pushes to <forwarders service>/<name> with
# an OIDC token of relaybus-fwd-push (on NATS, a durable pull consumer of
# that name, which the service pulls: below). One consume service,
# relaybus-forwarders (the consume image, CONSUMER_HANDLER=forwarders),
# serves every forwarder with the inbox, attempts, dead letters and ledger
# of a declared consumer.
#
# Off by default: enabling it lets an admin of a topic send that topic's
# events to any URL without a deploy, and on Pub/Sub gives dlqreplay the
# right to create and delete subscriptions in the project; a deployment
# opts in. Off, nothing below exists and POST /forwarders answers 501
# not_configured, naming DLQREPLAY_FORWARDERS_URL.
#
# What enabling it creates (README.md, "Service accounts and roles", lists
# every grant; infra/forwarders_test.go checks that enabling adds exactly
# these, on Pub/Sub and on NATS):
#   relaybus-forwarders   the service's account: its own Postgres role on
#                         forwarders.database (database.tf, "Roles": a consume
#                         role, whose grants include relaybus_inbox_forwarders),
#                         Cloud SQL Client, the claim check bucket's reader,
#                         telemetry; as a declared consumer's. On Pub/Sub also
#                         publisher on the rollup topic and on every
#                         <topic>.dlq (poison messages);
#   Scheduler             invoker of the service: /ledger:ship every minute,
#                         /inbox:purge daily, as for each consume service, and
#                         on Pub/Sub /breaker:probe every minute;
# and on Pub/Sub only, for the pushes:
#   relaybus-fwd-push     the identity of every forwarder's push: invoker of
#                         the forwarders service and nothing else;
#   dlqreplay             relaybusForwarderSubscriptions on the project
#                         (pubsub.subscriptions.create, .delete: Pub/Sub checks
#                         create on the project, and a subscription that does
#                         not exist yet can hold no grant of its own),
#                         relaybusAttachSubscription (pubsub.topics.attachSubscription)
#                         on each topology topic only (not the .dlq topics, not
#                         the rollup topic), and actAs on relaybus-fwd-push only
#                         (a push subscription's OIDC identity needs it,
#                         https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions);
#   the Pub/Sub agent     roles/pubsub.subscriber on the project: dead-lettering
#                         needs publisher on the dead-letter topic (granted per
#                         topic, iam.tf) and subscriber on the source
#                         subscription, to remove what it forwarded
#                         (https://cloud.google.com/pubsub/docs/dead-letter-topics);
#                         a subscription made at run time cannot be granted here
#                         one by one. Only Pub/Sub acts as its service agent;
#                         and token creator on relaybus-fwd-push (pushes' OIDC
#                         tokens, as iam.tf's agent_token_creator_*).
#
# On NATS (var.nats, nats.tf) JetStream pushes nothing: dlqreplay creates
# and deletes each forwarder's durable pull consumer itself, with the NATS
# credentials it already holds, and the forwarders service pulls every one
# (CONSUMER_MODE=pull, one worker per forwarder, functions/consume
# forwarders_pull.go), as rollup and dlqreplay pull theirs (run.tf,
# nats_pullers). So there the service runs exactly one instance (min = max
# = 1: two would each pull every forwarder, and one aggregate's events
# could be forwarded out of order), always on with CPU always allocated
# (its workers run between requests), each worker at most
# PULL_MAX_IN_FLIGHT deliveries (pull.tf: within the pool), reading the
# credentials secret mounted at /secrets/nats as every service does
# there. None of the Pub/Sub resources above exists: no push identity, no
# grant on topics or subscriptions, nothing for the Pub/Sub agent, and
# dlqreplay gets no DLQREPLAY_FORWARDERS_PUSH_ACCOUNT. Publishing rollup
# notices and dead letters goes through NATS, which IAM does not govern.
# Nor is there a /breaker:probe job: NATS has no push endpoint to detach,
# so a forwarder's open breaker holds its deliveries in the worker (no
# attempt counted) and the next one after the cool-down probes the
# target, and the service answers /breaker:probe 404 no_breaker_pause.

locals {
  # Whether the forwarders are deployed (terraform_data.forwarders refuses
  # a database the topology lacks), and how their deliveries arrive: pushed
  # by Pub/Sub, or pulled by the service itself on NATS.
  forwarders_enabled = var.forwarders.enabled
  forwarders_push    = local.forwarders_enabled && local.on_pubsub
  forwarders_pull    = local.forwarders_enabled && local.on_nats

  # The service's instances: forwarders.max_instances on Pub/Sub (pushes
  # scale it); exactly one on NATS, where each instance would pull every
  # forwarder. database.tf counts these against max_connections.
  forwarders_max_instances = local.on_nats ? 1 : var.forwarders.max_instances

  # The service's deterministic URL (as local.function_urls): what dlqreplay
  # points each forwarder's subscription at (DLQREPLAY_FORWARDERS_URL) and
  # the pushes' OIDC audience, known before the service exists.
  forwarders_url = "https://relaybus-forwarders-${data.google_project.this.number}.${var.region}.run.app"

  # Whether its database is in Cloud SQL (the volume, Cloud SQL Client).
  forwarders_cloudsql = local.forwarders_enabled && contains(keys(local.cloudsql_databases), var.forwarders.database)

  # The Pub/Sub topics a forwarder may be added on (dlqreplay attaches
  # subscriptions to these only; none on NATS).
  forwarders_topics = local.forwarders_push ? local.pubsub_topics : {}

  # The service's environment: consume's (functions/consume Config) for
  # CONSUMER_HANDLER=forwarders. What a declared consumer takes from the
  # topology each forwarder takes from its registry row: its name
  # (CONSUMER_ID, CONSUMER_SUBSCRIPTION), target (FORWARD_URL, FORWARD_AUTH,
  # FORWARD_AUDIENCE), timeout (FORWARD_TIMEOUT is the default of those
  # without one) and flow limits (CONSUMER_MAX_IN_FLIGHT,
  # CONSUMER_MAX_PER_SECOND); its subscription has the topology's defaults
  # (CONSUMER_MAX_DELIVERY_ATTEMPTS), and the breaker a declared forward
  # consumer's defaults (topology.tf, consumer_list). On NATS it pulls
  # (CONSUMER_MODE=pull: consume refuses push there, and pull on Pub/Sub),
  # each forwarder's worker holding at most PULL_MAX_IN_FLIGHT deliveries
  # (pull.tf's pull_max_in_flight, which terraform_data.pull_mode keeps
  # within cloud_sql.pool_max_conns) or the forwarder's maxInFlight if
  # lower; the workers share the one pool, so with several busy forwarders
  # deliveries may wait in it for a connection. TRANSPORT, NATS_URL and
  # NATS_CREDS come with env_common.
  forwarders_env = merge({ for n, v in local.env_common : n => v if !contains(["FIRESTORE_DATABASE", "LEDGER_RETENTION"], n) }, local.env_claim_check, {
    LEDGER                         = var.ledger
    CONSUMER_ID                    = "forwarders"
    CONSUMER_HANDLER               = "forwarders"
    CONSUMER_MODE                  = local.forwarders_pull ? "pull" : "push"
    CONSUMER_MAX_DELIVERY_ATTEMPTS = tostring(local.defaults.max_delivery_attempts)
    INBOX_RETENTION                = var.consume_settings.inbox_retention
    ROLLUP_TOPIC                   = local.rollup.topic
    LEDGER_BUDGET                  = var.ledger_budget
    FORWARD_TIMEOUT                = "10s"
    FORWARD_BREAKER_THRESHOLD      = "5"
    FORWARD_BREAKER_COOLDOWN       = "5s"
    FORWARD_BREAKER_MAX_COOLDOWN   = "300s"
    CONSUMER_FLOW_WAIT             = var.consume_settings.flow_wait
  }, local.forwarders_pull ? { PULL_MAX_IN_FLIGHT = tostring(local.pull_max_in_flight) } : {})

  # The secret holding RELAYBUS_FORWARDERS_KEY, when the forwarders are
  # deployed and forwarders.key_secret names one (a one-element list, for
  # the services' dynamic env blocks).
  forwarders_key_secret = local.forwarders_enabled && var.forwarders.key_secret != "" ? [var.forwarders.key_secret] : []

  # dlqreplay's forwarders settings (run.tf, function_wired_env): none when
  # off, so POST /forwarders answers 501 and says what is missing. On NATS
  # the URL only says the service is deployed (dlqreplay creates a durable
  # pull consumer, which nothing pushes), and there is no push identity.
  forwarders_dlqreplay_env = local.forwarders_enabled ? merge({
    DLQREPLAY_FORWARDERS_URL      = local.forwarders_url
    DLQREPLAY_FORWARDERS_DATABASE = var.forwarders.database
    }, local.forwarders_push ? {
    DLQREPLAY_FORWARDERS_PUSH_ACCOUNT = google_service_account.forwarders_push[0].email
  } : {}) : {}

  forwarders_errors = concat(
    var.forwarders.enabled && !contains(keys(local.databases), var.forwarders.database) ? ["forwarders.database \"${var.forwarders.database}\" is not one of the topology's databases (${join(", ", sort(keys(local.databases)))})"] : [],
  )
}

# Refuses forwarders on a database the topology lacks, before anything is
# created.
resource "terraform_data" "forwarders" {
  input = { enabled = local.forwarders_enabled, database = var.forwarders.database }

  lifecycle {
    precondition {
      condition     = length(local.forwarders_errors) == 0
      error_message = join("; ", local.forwarders_errors)
    }
  }
}

resource "google_service_account" "forwarders" {
  count        = local.forwarders_enabled ? 1 : 0
  account_id   = "relaybus-forwarders"
  display_name = "relaybus forwarders"
  description  = "The forwarders consume service (forward consumers added at run time): its database role, rollup notices, poison dead letters; no Firestore access."
}

resource "google_service_account" "forwarders_push" {
  count        = local.forwarders_push ? 1 : 0
  account_id   = "relaybus-fwd-push"
  display_name = "relaybus forwarders push"
  description  = "OIDC identity of every <topic>.<name>-forwarder push subscription: invokes the forwarders service, nothing else."
}

# ---- The forwarders service's own grants (as a declared consumer's) --------

# (try: a database the topology lacks is refused by terraform_data.forwarders,
# which this waits for, with the reason rather than an invalid index.)
resource "google_secret_manager_secret_iam_member" "forwarders_database_url" {
  count      = local.forwarders_enabled ? 1 : 0
  secret_id  = try(local.role_secret_ids["${var.forwarders.database}/forwarders"], "")
  role       = "roles/secretmanager.secretAccessor"
  member     = google_service_account.forwarders[0].member
  depends_on = [terraform_data.forwarders]
}

resource "google_project_iam_member" "forwarders_cloudsql_client" {
  count   = local.forwarders_cloudsql ? 1 : 0
  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = google_service_account.forwarders[0].member
}

# Rollup notices and poison messages: on Pub/Sub, publisher on the rollup
# topic and every <topic>.dlq (on NATS they go through the server, which
# IAM does not govern).
resource "google_pubsub_topic_iam_member" "forwarders_rollup" {
  count  = local.forwarders_push ? 1 : 0
  topic  = google_pubsub_topic.rollup[0].name
  role   = "roles/pubsub.publisher"
  member = google_service_account.forwarders[0].member
}

resource "google_pubsub_topic_iam_member" "forwarders_dead_letter" {
  for_each = local.forwarders_topics
  topic    = google_pubsub_topic.dead_letter[each.key].name
  role     = "roles/pubsub.publisher"
  member   = google_service_account.forwarders[0].member
}

resource "google_storage_bucket_iam_member" "forwarders_claim_check_read" {
  count  = local.forwarders_enabled && var.claim_check.enabled ? 1 : 0
  bucket = google_storage_bucket.claim_check[0].name
  role   = "roles/storage.objectViewer"
  member = google_service_account.forwarders[0].member
}

# Telemetry, as telemetry.tf grants each consume service.
resource "google_project_iam_member" "forwarders_telemetry_trace_writer" {
  count   = local.forwarders_enabled && local.telemetry_exports ? 1 : 0
  project = var.project_id
  role    = "roles/cloudtrace.agent"
  member  = google_service_account.forwarders[0].member
}

resource "google_project_iam_member" "forwarders_telemetry_metric_writer" {
  count   = local.forwarders_enabled && local.telemetry_exports ? 1 : 0
  project = var.project_id
  role    = "roles/monitoring.metricWriter"
  member  = google_service_account.forwarders[0].member
}

resource "google_project_iam_member" "forwarders_telemetry_quota_user" {
  count   = local.forwarders_enabled && local.telemetry_exports ? 1 : 0
  project = var.project_id
  role    = "roles/serviceusage.serviceUsageConsumer"
  member  = google_service_account.forwarders[0].member
}

# On NATS, the credentials file (NATS_CREDS), as nats.tf grants every
# function and consume service.
resource "google_secret_manager_secret_iam_member" "nats_credentials_forwarders" {
  count     = local.forwarders_enabled && length(local.nats_credentials) > 0 ? 1 : 0
  secret_id = var.nats.credentials_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.forwarders[0].member
}

# ---- Delivery to it ---------------------------------------------------------

# On Pub/Sub only: on NATS nothing pushes to the service (it pulls), so
# there is no push identity, and no Pub/Sub subscription for the agent to
# dead-letter on.

# Every forwarder's subscription pushes as relaybus-fwd-push...
resource "google_cloud_run_v2_service_iam_member" "forwarders_push_invoker" {
  count    = local.forwarders_push ? 1 : 0
  location = var.region
  name     = google_cloud_run_v2_service.forwarders[0].name
  role     = "roles/run.invoker"
  member   = google_service_account.forwarders_push[0].member
}

# ...whose OIDC tokens the Pub/Sub service agent mints (iam.tf,
# agent_token_creator_*).
resource "google_service_account_iam_member" "agent_token_creator_forwarders_push" {
  count              = local.forwarders_push ? 1 : 0
  service_account_id = google_service_account.forwarders_push[0].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# Dead-lettering on the forwarders' subscriptions: the agent removes what it
# forwarded to <topic>.dlq from the source subscription (the header above).
resource "google_project_iam_member" "agent_forwarders_dead_letter" {
  count   = local.forwarders_push ? 1 : 0
  project = var.project_id
  role    = "roles/pubsub.subscriber"
  member  = local.pubsub_service_agent
}

# Scheduler calls its /ledger:ship, /inbox:purge (and, on Pub/Sub,
# /breaker:probe), on either transport.
resource "google_cloud_run_v2_service_iam_member" "scheduler_forwarders_invoker" {
  count    = local.forwarders_enabled ? 1 : 0
  location = var.region
  name     = google_cloud_run_v2_service.forwarders[0].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

# ---- dlqreplay: create and delete the forwarders' subscriptions ------------

# On Pub/Sub only. On NATS dlqreplay creates and deletes each forwarder's
# durable pull consumer with its NATS credentials, as it provisions the
# topology's own at its start: nothing here.

# CreateSubscription needs pubsub.subscriptions.create on the project and
# pubsub.topics.attachSubscription on the topic; DeleteSubscription
# pubsub.subscriptions.delete on the subscription
# (https://cloud.google.com/pubsub/docs/access-control). Nothing else: no
# get, list, update or IAM policy.
resource "google_project_iam_custom_role" "forwarder_subscriptions" {
  count       = local.forwarders_push ? 1 : 0
  role_id     = "relaybusForwarderSubscriptions"
  title       = "relaybus forwarder subscriptions"
  description = "Create and delete Pub/Sub subscriptions (dlqreplay's forwarders added at run time)."
  permissions = [
    "pubsub.subscriptions.create",
    "pubsub.subscriptions.delete",
  ]
}

resource "google_project_iam_custom_role" "attach_subscription" {
  count       = local.forwarders_push ? 1 : 0
  role_id     = "relaybusAttachSubscription"
  title       = "relaybus attach subscription"
  description = "Attach a subscription to a topic (granted on the topology's topics only)."
  permissions = [
    "pubsub.topics.attachSubscription",
  ]
}

resource "google_project_iam_member" "dlqreplay_forwarder_subscriptions" {
  count   = local.forwarders_push ? 1 : 0
  project = var.project_id
  role    = google_project_iam_custom_role.forwarder_subscriptions[0].name
  member  = google_service_account.function["dlqreplay"].member
}

resource "google_pubsub_topic_iam_member" "dlqreplay_attach_subscription" {
  for_each = local.forwarders_topics
  topic    = google_pubsub_topic.topic[each.key].name
  role     = google_project_iam_custom_role.attach_subscription[0].name
  member   = google_service_account.function["dlqreplay"].member
}

resource "google_service_account_iam_member" "dlqreplay_act_as_forwarders_push" {
  count              = local.forwarders_push ? 1 : 0
  service_account_id = google_service_account.forwarders_push[0].name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.function["dlqreplay"].member
}

# A forwarder's pause detaches and sets back its subscription's push
# endpoint: its circuit breaker's, from the forwarders service, and an
# operator's, from dlqreplay (relaybus consumers pause/resume). That is
# relaybusPushControl (pubsub.subscriptions.get, .update; iam.tf), as for a
# declared push consumer; the forwarders' subscriptions are made at run
# time, so it is granted on the project, as dlqreplay's create and delete
# are...
resource "google_project_iam_member" "forwarders_push_control" {
  count   = local.forwarders_push ? 1 : 0
  project = var.project_id
  role    = google_project_iam_custom_role.push_control.name
  member  = google_service_account.forwarders[0].member
}

resource "google_project_iam_member" "dlqreplay_forwarders_push_control" {
  count   = local.forwarders_push ? 1 : 0
  project = var.project_id
  role    = google_project_iam_custom_role.push_control.name
  member  = google_service_account.function["dlqreplay"].member
}

# ...and setting the push identity back needs actAs on relaybus-fwd-push
# (dlqreplay has it above, for creating the subscriptions).
resource "google_service_account_iam_member" "forwarders_act_as_push" {
  count              = local.forwarders_push ? 1 : 0
  service_account_id = google_service_account.forwarders_push[0].name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.forwarders[0].member
}

# ---- The service -------------------------------------------------------------

# Its request timeout is the forwarders' subscriptions' ack deadline (the
# topology's default); its concurrency is forwarders.concurrency, its pool
# cloud_sql.pool_max_conns, its instances local.forwarders_max_instances
# (database.tf counts their pools against max_connections): on Pub/Sub up
# to forwarders.max_instances, scaled by the pushes; on NATS exactly one,
# always on, with CPU always allocated, as run.tf's nats_pullers (its pull
# workers run between requests, and no request starts them).
resource "google_cloud_run_v2_service" "forwarders" {
  count               = local.forwarders_enabled ? 1 : 0
  name                = "relaybus-forwarders"
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_INTERNAL_ONLY"
  deletion_protection = var.deletion_protection
  description         = "relaybus consume: the forward consumers added at run time (CONSUMER_HANDLER=forwarders)"

  template {
    service_account                  = google_service_account.forwarders[0].email
    max_instance_request_concurrency = var.forwarders.concurrency
    timeout                          = "${local.defaults.ack_deadline_seconds}s"

    scaling {
      min_instance_count = local.forwarders_pull ? 1 : 0
      max_instance_count = local.forwarders_max_instances
    }

    dynamic "volumes" {
      for_each = local.forwarders_cloudsql ? [local.cloudsql_connection_name] : []
      content {
        name = "cloudsql"
        cloud_sql_instance {
          instances = [volumes.value]
        }
      }
    }

    # On NATS with nats.credentials_secret: the credentials file (nats.tf).
    dynamic "volumes" {
      for_each = local.nats_credentials
      content {
        name = "nats"
        secret {
          secret = volumes.value
          items {
            version = "latest"
            path    = "creds"
          }
        }
      }
    }

    containers {
      image = local.images["consume"]

      dynamic "env" {
        for_each = local.forwarders_env
        content {
          name  = env.key
          value = env.value
        }
      }

      # RELAYBUS_FORWARDERS_KEY (forwarders.key_secret only): opens the hmac
      # forwarders' signing secrets, which dlqreplay seals with the same key.
      dynamic "env" {
        for_each = local.forwarders_key_secret
        content {
          name = "RELAYBUS_FORWARDERS_KEY"
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }

      # DATABASE_URL: the forwarders service's own role on its database.
      env {
        name = "DATABASE_URL"
        value_source {
          secret_key_ref {
            secret  = try(local.role_secret_ids["${var.forwarders.database}/forwarders"], "")
            version = "latest"
          }
        }
      }

      dynamic "volume_mounts" {
        for_each = local.forwarders_cloudsql ? ["cloudsql"] : []
        content {
          name       = volume_mounts.value
          mount_path = "/cloudsql"
        }
      }

      dynamic "volume_mounts" {
        for_each = local.nats_credentials
        content {
          name       = "nats"
          mount_path = "/secrets/nats"
        }
      }

      # It writes the ledger's attempts in the background, as consume does;
      # on NATS its pull workers run outside requests: CPU always.
      resources {
        limits   = { cpu = "1", memory = "512Mi" }
        cpu_idle = !var.always_allocated_cpu && !local.forwarders_pull
      }
    }
  }

  depends_on = [
    terraform_data.forwarders,
    terraform_data.topology,
    # On NATS: PULL_MAX_IN_FLIGHT within the pool.
    terraform_data.pull_mode,
    terraform_data.database_connections,
    time_sleep.iam_propagation,
    google_secret_manager_secret_version.role_url,
    terraform_data.migrate,
  ]
}

# ---- Scheduler: as for each consume service (scheduler.tf) -------------------

resource "google_cloud_scheduler_job" "forwarders_ledger_ship" {
  count            = local.forwarders_enabled ? 1 : 0
  name             = "relaybus-ledger-ship-forwarders"
  region           = var.region
  description      = "Ship the forwarders' consumption attempts the ledger missed (forwarders POST /ledger:ship)."
  schedule         = var.schedules.ledger_ship
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${min(1800, local.defaults.ack_deadline_seconds + local.scheduler_deadline_margin_seconds)}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.forwarders[0].uri}/ledger:ship"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.forwarders[0].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

# While a forwarder's circuit breaker keeps its subscription paused (its
# target is down), probe the target once the cool-down has passed and set
# the push endpoint back when it answers (forwarders POST /breaker:probe,
# every forwarder its breaker paused; an operator's pause is left alone).
# On Pub/Sub only: on NATS there is no push endpoint to detach, a
# forwarder's open breaker holds its deliveries in the pull worker and the
# first one after the cool-down probes the target, and /breaker:probe
# answers 404 no_breaker_pause (the broker has no push endpoints), which
# would fail this job every minute.
resource "google_cloud_scheduler_job" "forwarders_breaker_probe" {
  count            = local.forwarders_push ? 1 : 0
  name             = "relaybus-breaker-probe-forwarders"
  region           = var.region
  description      = "Probe the forward targets of the forwarders whose circuit breaker paused them, and resume each whose target answers (forwarders POST /breaker:probe)."
  schedule         = var.schedules.breaker_probe
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${min(1800, local.defaults.ack_deadline_seconds + local.scheduler_deadline_margin_seconds)}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.forwarders[0].uri}/breaker:probe"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.forwarders[0].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

resource "google_cloud_scheduler_job" "forwarders_inbox_purge" {
  count            = local.forwarders_enabled ? 1 : 0
  name             = "relaybus-inbox-purge-forwarders"
  region           = var.region
  description      = "Purge the forwarders' inbox rows past INBOX_RETENTION (forwarders POST /inbox:purge)."
  schedule         = var.schedules.inbox_purge
  time_zone        = var.scheduler_time_zone
  attempt_deadline = "${min(1800, local.defaults.ack_deadline_seconds + local.scheduler_deadline_margin_seconds)}s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.forwarders[0].uri}/inbox:purge"
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.forwarders[0].uri
    }
  }

  depends_on = [time_sleep.consume_invoker_propagation]
}

# RELAYBUS_FORWARDERS_KEY (forwarders.key_secret only): dlqreplay seals the
# hmac forwarders' signing secrets with it, the forwarders service opens
# them; each reads that one secret and no other.
resource "google_secret_manager_secret_iam_member" "forwarders_key" {
  count     = length(local.forwarders_key_secret)
  secret_id = var.forwarders.key_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.forwarders[0].member
}

resource "google_secret_manager_secret_iam_member" "dlqreplay_forwarders_key" {
  count     = length(local.forwarders_key_secret)
  secret_id = var.forwarders.key_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function["dlqreplay"].member
}
