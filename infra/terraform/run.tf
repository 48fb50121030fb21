# Cloud Run services: one per function, and one consume service per consumer.
# Environment variable names are the functions' (each function's Config; a
# test checks both ways that Terraform sets exactly what the Config reads).
# The topology file is baked into every image at /etc/relaybus/topology.yaml
# (infra/docker/Dockerfile); it must be the file Terraform read, which holds
# when both come from one checkout (cloudbuild.yaml).
#
# Database URLs never appear here: each DATABASE_URL* variable comes from the
# Secret Manager secret of the service's own role on that database
# (database.tf, "Roles"), and a service that uses a Cloud SQL database mounts
# the Cloud SQL volume at /cloudsql.
#
# CPU allocation (billing). publish, relay and consume answer first and then
# write the ledger in background goroutines, batched. Under request-based
# billing Cloud Run gives an instance CPU only while it handles a request, so
# that work would stall until the next request ("Avoid background activities
# if using request-based billing", https://cloud.google.com/run/docs/tips/general#background-activity;
# https://cloud.google.com/run/docs/configuring/billing-settings). They run
# with instance-based billing: cpu_idle = false (provider 6.14.1, template.
# containers.resources.cpu_idle: "True by default if the parent resources
# field is not set. However, if resources is set, this field must be
# explicitly set to true to preserve the default behavior",
# https://registry.terraform.io/providers/hashicorp/google/6.14.1/docs/resources/cloud_run_v2_service).
# rollup and dlqreplay do their work inside requests and set cpu_idle = true
# explicitly. Either way the ledger stays correct: the Scheduler jobs
# (scheduler.tf) ship what a stalled or killed instance missed (/ledger:ship)
# and re-derive statuses that are not final (/reconcile).

locals {
  topology_in_image = "/etc/relaybus/topology.yaml"

  # local.nats_env (nats.tf): TRANSPORT, NATS_URL and NATS_CREDS on NATS.
  env_common = merge(local.nats_env, {
    GOOGLE_CLOUD_PROJECT = var.project_id
    RELAYBUS_TOPOLOGY    = local.topology_in_image
    LOG_LEVEL            = var.log_level
    FIRESTORE_DATABASE   = var.firestore_database
    LEDGER_RETENTION     = var.ledger_retention
    SHUTDOWN_TIMEOUT     = var.shutdown_timeout
    # OpenTelemetry (telemetry.tf, internal/otelsetup, docs/telemetry.md):
    # the specification's variables, and relaybus's TELEMETRY_EXPORT.
    TELEMETRY_EXPORT            = var.telemetry.export
    OTEL_TRACES_SAMPLER         = var.telemetry.sampler
    OTEL_TRACES_SAMPLER_ARG     = tostring(var.telemetry.sample_ratio)
    OTEL_METRIC_EXPORT_INTERVAL = tostring(var.telemetry.metric_interval_seconds * 1000)
    # The Telemetry API files metrics under prometheus_target, whose
    # location is required: the region, without a metadata server read.
    OTEL_RESOURCE_ATTRIBUTES = "cloud.region=${var.region}"
  })

  # The relay's settings; publish's fast path runs the same relay code.
  env_relay = {
    RELAY_TIME_BUDGET  = "${local.relay.time_budget_seconds}s"
    RELAY_BATCH_SIZE   = tostring(var.relay_settings.batch_size)
    RELAY_AGGREGATES   = tostring(var.relay_settings.aggregates)
    RELAY_RUN_LIMIT    = tostring(var.relay_settings.run_limit)
    RELAY_CONCURRENCY  = tostring(var.relay_settings.workers)
    RELAY_LEASE        = var.relay_settings.lease
    RELAY_MAX_ATTEMPTS = tostring(var.relay_settings.max_attempts)
    RELAY_BACKOFF_BASE = var.relay_settings.backoff_base
    RELAY_BACKOFF_MAX  = var.relay_settings.backoff_max
    RELAY_HEAL_DELAY   = var.relay_settings.heal_delay
    OUTBOX_RETENTION   = var.relay_settings.outbox_retention
    LEDGER_BUDGET      = var.ledger_budget
  }

  # The four single services. Their databases are local.function_databases
  # (database.tf).
  functions = {
    publish = {
      env = merge(local.env_common, local.env_relay, local.env_claim_check, {
        LEDGER                    = var.ledger
        PUBLISH_FAST_PATH         = tostring(var.publish_settings.fast_path)
        PUBLISH_MAX_PAYLOAD_BYTES = tostring(var.publish_settings.max_payload_bytes)
        PUBLISH_BUDGET            = var.publish_settings.budget
        PUBLISH_MAX_IN_FLIGHT     = tostring(var.publish_settings.max_in_flight)
        # Behind Cloud Run IAM: the caller is read from the ID token it
        # verified; each topic's publishers (the topology's and
        # var.publishers) are the only callers it takes.
        PUBLISH_AUTH       = "cloudrun"
        PUBLISH_PUBLISHERS = jsonencode(var.publishers)
        PUBLISH_RATE_LIMIT = tostring(var.publish_settings.rate_limit)
        PUBLISH_RATE_BURST = tostring(var.publish_settings.rate_burst)
      })
      concurrency     = 80
      max_instances   = var.publish_settings.max_instances
      timeout_seconds = 60
      ingress         = var.publish_settings.ingress
      cpu_idle        = !var.always_allocated_cpu
    }
    # Called by Cloud Scheduler only, one job per database
    # (POST /?database=<name>); each request may run up to the Scheduler's
    # attempt deadline, above the relay's time budget. RELAY_DATABASES names
    # every database, so the relay knows which DATABASE_URL_* to expect.
    relay = {
      env = merge(local.env_common, local.env_relay, local.env_claim_check, {
        LEDGER          = var.ledger
        RELAY_DATABASES = join(",", sort(keys(local.databases)))
      })
      concurrency     = var.relay_settings.concurrency
      max_instances   = var.relay_settings.max_instances
      timeout_seconds = local.relay.attempt_deadline_seconds
      ingress         = "INGRESS_TRAFFIC_INTERNAL_ONLY"
      cpu_idle        = !var.always_allocated_cpu
    }
    # rollup coalesces the notices of concurrent requests into one ledger
    # transaction per event, so it gets real concurrency; /reconcile and
    # /expire (Scheduler) share the instances with the notices.
    rollup = {
      env = merge(local.env_common, {
        ROLLUP_WINDOW    = var.rollup_settings.window
        ROLLUP_WRITE_GAP = var.rollup_settings.write_gap
        # On NATS it pulls its notices (nats.tf).
        ROLLUP_MODE = local.on_nats ? "pull" : "push"
      })
      concurrency     = var.rollup_settings.concurrency
      max_instances   = var.rollup_settings.max_instances
      timeout_seconds = 60
      ingress         = "INGRESS_TRAFFIC_INTERNAL_ONLY"
      cpu_idle        = true
    }
    # The operations API behind Cloud Run IAM (DLQREPLAY_AUTH=cloudrun: the
    # platform verified the caller's ID token and hands it on with its
    # signature stripped; dlqreplay reads the caller from its claims).
    # DLQREPLAY_ARCHIVERS is the identity the <topic>.dlq-monitor push
    # subscriptions use; DLQREPLAY_SUBSCRIPTIONS maps every consumer's
    # logical subscription to the one Pub/Sub really has (eventarc.tf).
    dlqreplay = {
      env = merge(local.env_common, {
        DLQREPLAY_AUTH       = var.dlqreplay_settings.auth
        DLQREPLAY_WRITERS    = join(",", var.dlqreplay_settings.writers)
        DLQREPLAY_ROLES      = jsonencode(var.operators)
        DLQREPLAY_READ_ONLY  = tostring(var.dlqreplay_settings.read_only)
        DLQREPLAY_RATE_LIMIT = tostring(var.dlqreplay_settings.rate_limit)
        DLQREPLAY_RATE_BURST = tostring(var.dlqreplay_settings.rate_burst)
        ARCHIVE_RETENTION    = var.archive_retention
        # On NATS it pulls the DLQ monitors (nats.tf).
        ARCHIVE_MODE = local.on_nats ? "pull" : "push"
        # The audit log's database of its own (firestore.tf).
        FIRESTORE_AUDIT_DATABASE = var.audit_firestore_database
      })
      concurrency     = 20
      max_instances   = var.dlqreplay_settings.max_instances
      timeout_seconds = 300
      ingress         = var.dlqreplay_settings.ingress
      cpu_idle        = true
    }
  }

  # dlqreplay's settings that name other resources (kept out of
  # local.functions, whose keys the service accounts iterate).
  function_wired_env = {
    publish = {}
    relay   = {}
    rollup  = {}
    # The forwarders' settings (forwarders.tf) when they are deployed.
    dlqreplay = merge(local.forwarders_dlqreplay_env, {
      # The audiences an ID token may have: checked by every auth mode
      # (local.dlqreplay_audiences).
      DLQREPLAY_AUDIENCE      = join(",", local.dlqreplay_audiences)
      DLQREPLAY_ARCHIVERS     = google_service_account.dead_letter_push.email
      DLQREPLAY_SUBSCRIPTIONS = jsonencode(local.consumer_subscription_ids)
      # What :resume sets back on a paused push consumer: the push_config
      # of google_pubsub_subscription.consumer.
      # The consumers deployed in pull mode: pause, resume and rebuild
      # refuse them with the reason (they have no push endpoint).
      DLQREPLAY_PULL_CONSUMERS = join(",", sort(keys(local.pull_consumers)))
      DLQREPLAY_PUSH_TARGETS = jsonencode({
        for k, c in local.push_consumers : k => {
          endpoint       = google_cloud_run_v2_service.consume[k].uri
          serviceAccount = google_service_account.consume[k].email
          audience       = google_cloud_run_v2_service.consume[k].uri
        }
      })
    })
  }

  # Each function's deterministic Cloud Run URL
  # (https://<service>-<project number>.<region>.run.app): known before the
  # service exists, so a service's own environment can name it.
  function_urls = { for f in ["publish", "relay", "rollup", "dlqreplay"] : f => "https://relaybus-${f}-${data.google_project.this.number}.${var.region}.run.app" }

  # The audiences dlqreplay takes (DLQREPLAY_AUDIENCE): its deterministic URL
  # (what operators call, output dlqreplay_url, and the DLQ monitors' push
  # audience), gcloud's client id (the audience of a user's
  # `gcloud auth print-identity-token`, which Cloud Run also admits) and any
  # the deployment adds.
  dlqreplay_audiences = concat([local.function_urls["dlqreplay"], "32555940559.apps.googleusercontent.com"], var.dlqreplay_settings.audiences)

  # dlqreplay's personal tokens (DLQREPLAY_AUTH=token only), from Secret Manager.
  dlqreplay_token_secret = var.dlqreplay_settings.auth == "token" ? [var.dlqreplay_settings.token_secret] : []

  # consume, per consumer. CONSUMER_SUBSCRIPTION is the topology's
  # subscription id (for an Eventarc consumer, the logical name: the trigger's
  # own subscription has a generated name).
  consume_env = {
    # consume opens no Firestore client (it records through the rollup
    # topic), so it gets no ledger database settings.
    for k, c in local.consumers : k => merge({ for n, v in local.env_common : n => v if !contains(["FIRESTORE_DATABASE", "LEDGER_RETENTION"], n) }, local.env_claim_check, {
      LEDGER                         = var.ledger
      CONSUMER_ID                    = c.service
      CONSUMER_SUBSCRIPTION          = c.subscription
      CONSUMER_HANDLER               = c.handler
      CONSUMER_MAX_DELIVERY_ATTEMPTS = tostring(c.max_delivery_attempts)
      INBOX_RETENTION                = var.consume_settings.inbox_retention
      ROLLUP_TOPIC                   = local.rollup.topic
      LEDGER_BUDGET                  = var.ledger_budget
      FORWARD_URL                    = c.forward_url
      FORWARD_AUTH                   = c.forward_auth
      FORWARD_AUDIENCE               = c.forward_audience
      FORWARD_TIMEOUT                = "${c.forward_timeout_seconds}s"
      FORWARD_BREAKER_THRESHOLD      = tostring(c.forward_breaker_threshold)
      FORWARD_BREAKER_COOLDOWN       = "${c.forward_breaker_cooldown_seconds}s"
      FORWARD_BREAKER_MAX_COOLDOWN   = "${c.forward_breaker_max_cooldown_seconds}s"
      FORWARD_PROBE                  = c.forward_probe
      STRICT_GAP_TIMEOUT             = "${c.gap_timeout_seconds}s"
      # push (Pub/Sub push or Eventarc POSTs deliveries) or pull (pull.tf).
      CONSUMER_MODE      = contains(keys(local.pull_consumers), k) ? "pull" : "push"
      PULL_MAX_IN_FLIGHT = tostring(local.pull_max_in_flight)
      # Flow control (topology max_in_flight, max_per_second; consume_flow):
      # 0 is no limit of consume's own.
      CONSUMER_MAX_IN_FLIGHT  = tostring(local.consume_flow[k].max_in_flight)
      CONSUMER_MAX_PER_SECOND = tostring(local.consume_flow[k].per_second)
      CONSUMER_FLOW_WAIT      = var.consume_settings.flow_wait
    })
  }

  # FORWARD_SIGNING_SECRET of the forward consumers that sign
  # (forward_auth hmac), from the Secret Manager secret the topology names
  # (forward_secret): the operator creates it and shares its value with the
  # target; Terraform only grants consume access to it (iam.tf).
  consume_signing_secrets = { for k, c in local.consumers : k => c.forward_secret if c.forward_auth == "hmac" }

  # Whether a service opens a Cloud SQL database (and so mounts the volume).
  function_uses_cloudsql = { for f, dbs in local.function_databases : f => anytrue([for db in values(dbs) : contains(keys(local.cloudsql_databases), db)]) }
  consume_uses_cloudsql  = { for k, c in local.consumers : k => contains(keys(local.cloudsql_databases), c.database) }
}

resource "google_cloud_run_v2_service" "function" {
  for_each            = local.functions
  name                = "relaybus-${each.key}"
  location            = var.region
  ingress             = each.value.ingress
  deletion_protection = var.deletion_protection

  template {
    service_account                  = google_service_account.function[each.key].email
    max_instance_request_concurrency = each.value.concurrency
    timeout                          = "${each.value.timeout_seconds}s"

    # On NATS rollup and dlqreplay pull: always-on instances (nats.tf).
    scaling {
      min_instance_count = contains(local.nats_pullers, each.key) ? try(var.nats.min_instances, 1) : 0
      max_instance_count = max(each.value.max_instances, contains(local.nats_pullers, each.key) ? try(var.nats.min_instances, 1) : 0)
    }

    dynamic "volumes" {
      for_each = local.function_uses_cloudsql[each.key] ? [local.cloudsql_connection_name] : []
      content {
        name = "cloudsql"
        cloud_sql_instance {
          instances = [volumes.value]
        }
      }
    }

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
      image = local.images[each.key]

      dynamic "env" {
        for_each = merge(each.value.env, local.function_wired_env[each.key])
        content {
          name  = env.key
          value = env.value
        }
      }

      # DATABASE_URL (and the relay's DATABASE_URL_<NAME>) from the secret of
      # this function's role on each database.
      dynamic "env" {
        for_each = local.function_databases[each.key]
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = local.role_secret_ids["${env.value}/${each.key}"]
              version = "latest"
            }
          }
        }
      }

      # PRIVACY_KEY: the privacy rules' hash key (docs/privacy.md), for the
      # functions that write or read the ledger's payloads.
      dynamic "env" {
        for_each = var.privacy_key_secret != "" ? [var.privacy_key_secret] : []
        content {
          name = "PRIVACY_KEY"
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }

      # RELAYBUS_FORWARDERS_KEY: dlqreplay seals the hmac forwarders'
      # signing secrets with it (forwarders.tf, forwarders.key_secret).
      dynamic "env" {
        for_each = each.key == "dlqreplay" ? local.forwarders_key_secret : []
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

      dynamic "env" {
        for_each = each.key == "dlqreplay" ? local.dlqreplay_token_secret : []
        content {
          name = "DLQREPLAY_TOKEN"
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }

      dynamic "volume_mounts" {
        for_each = local.function_uses_cloudsql[each.key] ? ["cloudsql"] : []
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

      resources {
        limits   = { cpu = "1", memory = "512Mi" }
        cpu_idle = each.value.cpu_idle && !contains(local.nats_pullers, each.key)
      }
    }
  }

  depends_on = [
    terraform_data.topology,
    terraform_data.database_connections,
    # Secrets are read when a revision starts: their grants (and Cloud SQL
    # Client) must have propagated first.
    time_sleep.iam_propagation,
    google_secret_manager_secret_version.role_url,
    # The tables migrated and the roles in place.
    terraform_data.migrate,
  ]
}

resource "google_cloud_run_v2_service" "consume" {
  for_each            = local.consumers
  name                = each.value.run_service
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_INTERNAL_ONLY"
  deletion_protection = var.deletion_protection
  description         = "relaybus consume: ${each.value.subscription} (${contains(keys(local.pull_consumers), each.key) ? "pull" : each.value.delivery})"

  template {
    service_account = google_service_account.consume[each.key].email
    # The topology's max_in_flight, else consume_settings.concurrency
    # (topology.tf, consume_flow).
    max_instance_request_concurrency = local.consume_flow[each.key].concurrency
    # Pub/Sub stops waiting at the ack deadline; so does the request.
    timeout = "${each.value.ack_deadline_seconds}s"

    # A pull consumer (pull.tf) is a worker no request starts: always-on
    # instances, within its own bounds.
    scaling {
      min_instance_count = contains(keys(local.pull_consumers), each.key) ? min(var.pull_mode.min_instances, local.consume_flow[each.key].max_instances) : 0
      max_instance_count = local.consume_flow[each.key].max_instances
    }

    dynamic "volumes" {
      for_each = local.consume_uses_cloudsql[each.key] ? [local.cloudsql_connection_name] : []
      content {
        name = "cloudsql"
        cloud_sql_instance {
          instances = [volumes.value]
        }
      }
    }

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
        for_each = local.consume_env[each.key]
        content {
          name  = env.key
          value = env.value
        }
      }

      # DATABASE_URL: the consumer's own database (topology: database), as
      # the consumer's own role.
      dynamic "env" {
        for_each = local.consume_databases[each.key]
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = local.role_secret_ids["${env.value}/${each.key}"]
              version = "latest"
            }
          }
        }
      }

      # FORWARD_SIGNING_SECRET: a signing forward consumer's secret.
      dynamic "env" {
        for_each = contains(keys(local.consume_signing_secrets), each.key) ? [local.consume_signing_secrets[each.key]] : []
        content {
          name = "FORWARD_SIGNING_SECRET"
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }

      dynamic "volume_mounts" {
        for_each = local.consume_uses_cloudsql[each.key] ? ["cloudsql"] : []
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

      # A pull worker runs outside requests: instance-based billing always.
      resources {
        limits   = { cpu = "1", memory = "512Mi" }
        cpu_idle = !var.always_allocated_cpu && !contains(keys(local.pull_consumers), each.key)
      }
    }
  }

  depends_on = [
    terraform_data.topology,
    terraform_data.database_connections,
    terraform_data.pull_mode,
    time_sleep.iam_propagation,
    # A pull consumer's worker pulls as soon as its revision starts: its
    # subscriber grant must have propagated, or the worker backs off (up
    # to ten minutes) on PermissionDenied.
    time_sleep.pull_grant_propagation,
    google_secret_manager_secret_version.role_url,
    terraform_data.migrate,
  ]
}
