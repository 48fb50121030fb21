# The ledger's Firestore database, its indexes, and topic_consumers.
#
# Indexes come from infra/firestore/indexes.yaml, the ledger's declaration of
# every composite index its queries need and every single-field exemption
# (internal/ledger checks the file against its query shapes).

locals {
  firestore_indexes = yamldecode(file("${path.module}/../firestore/indexes.yaml"))

  # Keyed by collection and the fields of the query the index serves, shard
  # left out, e.g. "events:status:ASCENDING,occurredAt:DESCENDING": adding
  # the shard field to an index (as the aggregate index got it) keeps its
  # key, so Terraform replaces that one index, new before old
  # (create_before_destroy below), instead of destroying it and creating
  # another at once.
  composite_indexes = {
    for ix in local.firestore_indexes.composite :
    "${ix.collection}:${join(",", [for f in ix.fields : "${f.field}:${f.order}" if f.field != "shard"])}" => ix
  }

  # Ledger retention (Firestore TTL). The ledger writes a timestamp deleteAt
  # (now + LEDGER_RETENTION, or ARCHIVE_RETENTION for archived dead letters)
  # on every document of these collection groups, and Firestore deletes a
  # document typically within 24 hours after it. A TTL deletion does not
  # delete subcollections, hence event_consumptions (each event's attempts)
  # has its own policy. The TTL field is exempt from single-field indexes:
  # an indexed timestamp written at "now" is a hotspot. A TTL policy and an
  # index exemption on one field are one field configuration
  # (https://cloud.google.com/firestore/docs/ttl;
  # https://registry.terraform.io/providers/hashicorp/google/6.14.1/docs/resources/firestore_field).
  ttl_field = "deleteAt"
  ttl_fields = {
    for c in ["events", "event_consumptions", "dead_letters"] : "${c}/${local.ttl_field}" => { collection = c, field = local.ttl_field }
  }

  # Keyed "collection/field". A field that has a TTL policy gets its
  # exemption from google_firestore_field.ttl instead (one resource per field).
  index_exemptions = {
    for ex in local.firestore_indexes.exemptions : "${ex.collection}/${ex.field}" => ex
    if !contains(keys(local.ttl_fields), "${ex.collection}/${ex.field}")
  }

  database_id = var.create_firestore_database ? google_firestore_database.ledger[0].name : var.firestore_database
}

resource "google_firestore_database" "ledger" {
  count       = var.create_firestore_database ? 1 : 0
  name        = var.firestore_database
  location_id = var.firestore_location
  type        = "FIRESTORE_NATIVE"
  # Transactions lock what they read: rollup's correctness relies on it.
  concurrency_mode        = "PESSIMISTIC"
  delete_protection_state = var.deletion_protection ? "DELETE_PROTECTION_ENABLED" : "DELETE_PROTECTION_DISABLED"
  deletion_policy         = var.deletion_protection ? "ABANDON" : "DELETE"
  depends_on              = [time_sleep.api_propagation]
}

# The operators' audit log (operator_audit), in a database of its own:
# Firestore's IAM has no per-collection grants for server clients, so the
# database is the unit a grant can leave out. dlqreplay's identity may only
# create and read entries there (iam.tf, relaybusAuditAppender); no runtime
# identity may update or delete one, the consumers and the other functions
# hold nothing on it, and point-in-time recovery keeps seven days of
# versions should an administrator's hand go astray. Entries are few (one
# per operator action); the log's one query (newest first by at) needs no
# composite index.
resource "google_firestore_database" "audit" {
  name                              = var.audit_firestore_database
  location_id                       = var.firestore_location
  type                              = "FIRESTORE_NATIVE"
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  delete_protection_state           = var.deletion_protection ? "DELETE_PROTECTION_ENABLED" : "DELETE_PROTECTION_DISABLED"
  deletion_policy                   = var.deletion_protection ? "ABANDON" : "DELETE"
  depends_on                        = [time_sleep.api_propagation]
}

resource "google_firestore_index" "ledger" {
  for_each    = local.composite_indexes
  database    = local.database_id
  collection  = each.value.collection
  query_scope = "COLLECTION"

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path = fields.value.field
      order      = fields.value.order
    }
  }

  # An index's fields cannot change in place: a changed index (the shard
  # field added to the aggregate index) is a new one. Build it before the
  # old one goes, or the queries it serves (the console's aggregate search)
  # fail for as long as Firestore takes to build it.
  lifecycle {
    create_before_destroy = true
  }
}

# The indexes were keyed by every field, shard included, before: their
# state moves to the new keys (infra/terraform_test.go checks each).
moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,status:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:status:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,topic:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:topic:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:initiator.service:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,status:ASCENDING,topic:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:status:ASCENDING,topic:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,status:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:status:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,topic:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:topic:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,status:ASCENDING,topic:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:status:ASCENDING,topic:ASCENDING,initiator.service:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,aggregateId:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:aggregateId:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,eventType:ASCENDING,occurredAt:DESCENDING"]
  to   = google_firestore_index.ledger["events:eventType:ASCENDING,occurredAt:DESCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,expireDue:ASCENDING"]
  to   = google_firestore_index.ledger["events:expireDue:ASCENDING"]
}

moved {
  from = google_firestore_index.ledger["events:shard:ASCENDING,checkAt:ASCENDING"]
  to   = google_firestore_index.ledger["events:checkAt:ASCENDING"]
}

# An empty index_config removes the field's automatic single-field indexes.
resource "google_firestore_field" "exemption" {
  for_each   = local.index_exemptions
  database   = local.database_id
  collection = each.value.collection
  field      = each.value.field

  index_config {}
}

# TTL policy and no single-field index on each ledger collection's deleteAt.
resource "google_firestore_field" "ttl" {
  for_each   = local.ttl_fields
  database   = local.database_id
  collection = each.value.collection
  field      = each.value.field

  ttl_config {}
  index_config {}
}

# topic_consumers from the topology: the rollup image's `sync-consumers`
# command (ledger.Store.SyncConsumers, the one implementation of the
# collection's format) as a Cloud Run job, executed on every apply that
# changes the topology or the image. Consumers removed from the topology are
# disabled, not deleted (events already sent keep their expected list).
resource "google_cloud_run_v2_job" "sync_consumers" {
  name                = "relaybus-sync-consumers"
  location            = var.region
  deletion_protection = var.deletion_protection

  template {
    task_count = 1
    template {
      service_account = google_service_account.function["rollup"].email
      max_retries     = 3
      timeout         = "300s"

      containers {
        image = local.images["rollup"]
        args  = ["sync-consumers"]

        dynamic "env" {
          for_each = local.env_common
          content {
            name  = env.key
            value = env.value
          }
        }
      }
    }
  }

  depends_on = [google_firestore_database.ledger, terraform_data.topology]
}

# Executed by the machine applying Terraform, after rollup's ledger grant has
# propagated (an execution right after the grant would fail on Firestore).
resource "terraform_data" "sync_consumers" {
  triggers_replace = [local.topology_hash, local.images["rollup"]]

  depends_on = [time_sleep.iam_propagation, google_cloud_run_v2_job.sync_consumers]

  provisioner "local-exec" {
    command = join(" ", [for a in [var.gcloud, "run", "jobs", "execute", google_cloud_run_v2_job.sync_consumers.name, "--project=${var.project_id}", "--region=${var.region}", "--wait"] : "'${replace(a, "'", "'\\''")}'"])
  }
}
