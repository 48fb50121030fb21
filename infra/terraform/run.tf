# Cloud Run services: one per function, and one consume service per consumer.
# Environment variable names are the functions' (docs: TEAM contract and each
# function's Config). The topology file is baked into every image at
# /etc/relaybus/topology.yaml (infra/docker/Dockerfile); it must be the file Terraform read,
# which holds when both come from one checkout (cloudbuild.yaml).

locals {
  topology_in_image = "/etc/relaybus/topology.yaml"

  env_common = {
    GOOGLE_CLOUD_PROJECT = var.project_id
    RELAYBUS_TOPOLOGY    = local.topology_in_image
    LOG_LEVEL            = var.log_level
    FIRESTORE_DATABASE   = var.firestore_database
  }

  # The relay's settings; publish's fast path runs the same relay code.
  env_relay = {
    RELAY_TIME_BUDGET  = "${local.relay.time_budget_seconds}s"
    RELAY_BATCH_SIZE   = tostring(var.relay_settings.batch_size)
    RELAY_LEASE        = var.relay_settings.lease
    RELAY_MAX_ATTEMPTS = tostring(var.relay_settings.max_attempts)
    RELAY_BACKOFF_BASE = var.relay_settings.backoff_base
    RELAY_BACKOFF_MAX  = var.relay_settings.backoff_max
    OUTBOX_RETENTION   = var.relay_settings.outbox_retention
  }

  # The four single services. database: DATABASE_URL from var.database_url_secret.
  functions = {
    publish = {
      env = merge(local.env_common, local.env_relay, {
        LEDGER                    = var.ledger
        PUBLISH_FAST_PATH         = tostring(var.publish_settings.fast_path)
        PUBLISH_MAX_PAYLOAD_BYTES = tostring(var.publish_settings.max_payload_bytes)
      })
      database        = true
      concurrency     = 80
      max_instances   = var.publish_settings.max_instances
      timeout_seconds = 60
      ingress         = var.publish_settings.ingress
    }
    # Called by Cloud Scheduler only; the request may run up to the
    # Scheduler's attempt deadline, above the relay's time budget.
    relay = {
      env             = merge(local.env_common, local.env_relay, { LEDGER = var.ledger })
      database        = true
      concurrency     = 1
      max_instances   = var.relay_settings.max_instances
      timeout_seconds = local.relay.attempt_deadline_seconds
      ingress         = "INGRESS_TRAFFIC_INTERNAL_ONLY"
    }
    # Concurrency 1 and one instance: a throttle on Firestore transactions,
    # not what makes rollup correct (its transaction does that).
    rollup = {
      env             = local.env_common
      database        = false
      concurrency     = 1
      max_instances   = 1
      timeout_seconds = 60
      ingress         = "INGRESS_TRAFFIC_INTERNAL_ONLY"
    }
    dlqreplay = {
      env             = merge(local.env_common, { DLQREPLAY_AUTH = var.dlqreplay_settings.auth })
      database        = true
      concurrency     = 20
      max_instances   = 2
      timeout_seconds = 300
      ingress         = var.dlqreplay_settings.ingress
    }
  }

  # consume, per consumer. CONSUMER_SUBSCRIPTION is the topology's
  # subscription id (for an Eventarc consumer, the logical name: the trigger's
  # own subscription has a generated name).
  consume_env = {
    for k, c in local.consumers : k => merge(local.env_common, {
      LEDGER                         = var.ledger
      CONSUMER_ID                    = c.service
      CONSUMER_SUBSCRIPTION          = c.subscription
      CONSUMER_HANDLER               = c.handler
      CONSUMER_MAX_DELIVERY_ATTEMPTS = tostring(c.max_delivery_attempts)
      INBOX_RETENTION                = var.consume_settings.inbox_retention
      ROLLUP_TOPIC                   = local.rollup.topic
      FORWARD_URL                    = c.forward_url
    })
  }
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

    scaling {
      min_instance_count = 0
      max_instance_count = each.value.max_instances
    }

    containers {
      image = local.images[each.key]

      dynamic "env" {
        for_each = each.value.env
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = each.value.database ? [var.database_url_secret] : []
        content {
          name = "DATABASE_URL"
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }

      resources {
        limits = { cpu = "1", memory = "512Mi" }
      }
    }
  }

  depends_on = [
    google_project_service.api,
    google_secret_manager_secret_iam_member.function_database,
  ]
}

resource "google_cloud_run_v2_service" "consume" {
  for_each            = local.consumers
  name                = each.value.run_service
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_INTERNAL_ONLY"
  deletion_protection = var.deletion_protection
  description         = "relaybus consume: ${each.value.subscription} (${each.value.delivery})"

  template {
    service_account                  = google_service_account.consume[each.key].email
    max_instance_request_concurrency = var.consume_settings.concurrency
    # Pub/Sub stops waiting at the ack deadline; so does the request.
    timeout = "${each.value.ack_deadline_seconds}s"

    scaling {
      min_instance_count = 0
      max_instance_count = var.consume_settings.max_instances
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

      env {
        name = "DATABASE_URL"
        value_source {
          secret_key_ref {
            secret  = local.consumer_database_secrets[each.key]
            version = "latest"
          }
        }
      }

      resources {
        limits = { cpu = "1", memory = "512Mi" }
      }
    }
  }

  depends_on = [
    google_project_service.api,
    google_secret_manager_secret_iam_member.consume_database,
  ]
}
