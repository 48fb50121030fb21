# Claim check (docs/producing.md, "Large payloads"): a message whose data is
# over var.claim_check.threshold_bytes is published without it, as a
# reference to an object in this bucket (gs://<bucket>/<topic>/<event id>);
# consume reads it back before it decodes the message. The outbox keeps the
# payload itself; the object is the broker's copy.
#
# Retention: a lifecycle rule deletes each object retention_days after it
# was written. The default is the longest message retention of any topic
# (topology message_retention_seconds, rounded up to days): as long as
# Pub/Sub can deliver the message, redeliver it, or seek back to it, its
# object exists. Dead letters archived in Firestore and replayed later than
# that find their object gone and are dead-lettered again with reason
# claim_check; raise retention_days to keep replays of old dead letters
# working.
#
# Grants (README.md, "Service accounts and roles"): publish and relay write
# (roles/storage.objectUser: a retried publish overwrites its object, which
# takes delete as well as create); every consumer reads
# (roles/storage.objectViewer); a consumer that emits child events writes
# too, since its kick publishes them.

locals {
  claim_check_bucket = var.claim_check.enabled ? coalesce(var.claim_check.bucket, "${var.project_id}-relaybus-claims") : ""
  claim_check_retention_days = coalesce(var.claim_check.retention_days,
  floor((max(concat([86400], [for t in local.topics : t.message_retention_seconds])...) + 86399) / 86400))
  # The variables publish, relay and consume read (claimcheck.Config).
  env_claim_check = {
    CLAIM_CHECK_BUCKET    = local.claim_check_bucket
    CLAIM_CHECK_THRESHOLD = tostring(var.claim_check.threshold_bytes)
  }
  claim_check_writers  = var.claim_check.enabled ? toset(["publish", "relay"]) : toset([])
  claim_check_readers  = var.claim_check.enabled ? local.consumers : {}
  claim_check_emitters = var.claim_check.enabled ? { for k, c in local.consumers : k => c if length(c.emits) > 0 } : {}
}

resource "google_storage_bucket" "claim_check" {
  count                       = var.claim_check.enabled ? 1 : 0
  name                        = local.claim_check_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = !var.deletion_protection

  lifecycle_rule {
    condition {
      age = local.claim_check_retention_days
    }
    action {
      type = "Delete"
    }
  }
}

resource "google_storage_bucket_iam_member" "claim_check_writers" {
  for_each = local.claim_check_writers
  bucket   = google_storage_bucket.claim_check[0].name
  role     = "roles/storage.objectUser"
  member   = google_service_account.function[each.key].member
}

resource "google_storage_bucket_iam_member" "consume_claim_check_read" {
  for_each = local.claim_check_readers
  bucket   = google_storage_bucket.claim_check[0].name
  role     = "roles/storage.objectViewer"
  member   = google_service_account.consume[each.key].member
}

resource "google_storage_bucket_iam_member" "consume_claim_check_write" {
  for_each = local.claim_check_emitters
  bucket   = google_storage_bucket.claim_check[0].name
  role     = "roles/storage.objectUser"
  member   = google_service_account.consume[each.key].member
}
