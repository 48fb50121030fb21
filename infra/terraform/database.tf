# The Postgres databases of the topology (local.databases): the outbox of
# publish (main) and of every consumer, their inboxes and projections.
#
# Each database is either
#   - in Cloud SQL for PostgreSQL (the default): Terraform creates the
#     instance (or uses an existing one, var.cloud_sql.create = false), one
#     database and one user per topology database, and a Secret Manager secret
#     relaybus-database-url-<name> holding the URL; or
#   - elsewhere: var.database_url_secrets names an existing secret whose latest
#     version is the full URL (Terraform neither creates nor reads it).
#
# How Cloud Run reaches Cloud SQL: the Cloud SQL volume of
# google_cloud_run_v2_service (template.volumes.cloud_sql_instance, mounted at
# /cloudsql; provider 6.14.1:
# https://registry.terraform.io/providers/hashicorp/google/6.14.1/docs/resources/cloud_run_v2_service),
# which serves a Unix socket /cloudsql/<project>:<region>:<instance>/.s.PGSQL.5432
# through Google's Cloud SQL connector. The service's identity needs
# roles/cloudsql.client and the Cloud SQL Admin API must be on
# (https://cloud.google.com/sql/docs/postgres/connect-run). The instance has a
# public IP but no authorized networks, so only such connectors reach it; the
# connector encrypts the traffic, hence sslmode=disable on the socket.
#
# The URL (pgx, github.com/jackc/pgx/v5/pgxpool.ParseConfig):
#   postgres://<user>:<password>@/<database>?host=/cloudsql/<connection name>&sslmode=disable&pool_max_conns=<n>&pool_max_conn_idle_time=60s
# infra/database_test.go parses it with pgxpool to prove the host is the
# socket directory and MaxConns is the pool size.
#
# Pool sizes against the instance's connection limit. Every Cloud Run
# instance of a service opens at most pool_max_conns connections to each
# database it uses (pgx reads pool_max_conns from the URL), so at most
#   connections = pool_max_conns × Σ over databases d on the instance of
#                 Σ over services using d of that service's max instances
# where main is used by publish and every consumer on main, and every
# database by the relay and dlqreplay and its own consumers. That must
# stay within max_connections − reserved_connections (PostgreSQL keeps
# superuser_reserved_connections, Cloud SQL's own maintenance connects, and an
# operator needs a psql session). With the defaults (pool 5; publish 20,
# dlqreplay 2, relay 3, consume 10 instances each) and the repository's
# topology (3 consumers on main, 1 on member):
#   main   5 × (20 + 2 + 3 + 3×10) = 275
#   member 5 × (2 + 3 + 10)        =  75
#   total 350 ≤ 400 − 20 = 380
# (infra/firstapply_test.go checks these figures, and the README's, against
# the locals.) The bound is per revision: a deploy moves all traffic to the
# new revision, and the old one's instances, no longer sent requests, close
# their idle connections after pool_max_conn_idle_time (60s, in the URL; pgx
# checks every minute), so an old revision's pools are gone within about two
# minutes instead of lasting as long as Cloud Run keeps its idle instances.
# terraform_data.database_connections refuses a plan that exceeds it, with
# the numbers. A request beyond the pool waits in pgx for a connection (a
# consume instance serves 40 deliveries at once on 5 connections by
# default); more parallelism per instance means a larger pool_max_conns,
# and so a larger max_connections and tier, or fewer max instances. max_connections is set as a database flag on the instance
# Terraform creates (https://cloud.google.com/sql/docs/postgres/flags); for an
# existing instance, var.cloud_sql.max_connections must be its real value.

locals {
  # Databases in Cloud SQL: those without an external URL secret.
  cloudsql_databases = { for k, d in local.databases : k => d if !contains(keys(var.database_url_secrets), k) }
  use_cloud_sql      = length(local.cloudsql_databases) > 0
  cloudsql_region    = coalesce(var.cloud_sql.region, var.region)

  cloudsql_instance_name = local.use_cloud_sql ? (var.cloud_sql.create ? google_sql_database_instance.relaybus[0].name : data.google_sql_database_instance.existing[0].name) : ""
  # <project>:<region>:<instance>, the name the Cloud SQL volume mounts.
  cloudsql_connection_name = local.use_cloud_sql ? (var.cloud_sql.create ? google_sql_database_instance.relaybus[0].connection_name : data.google_sql_database_instance.existing[0].connection_name) : ""

  # Postgres names: relaybus_<name> (- as _), so psql needs no quoting.
  cloudsql_names = { for k, d in local.cloudsql_databases : k => "relaybus_${replace(k, "-", "_")}" }

  # The URL of each Cloud SQL database; it only ever goes into its secret.
  cloudsql_urls = {
    for k, d in local.cloudsql_databases : k => format(
      "postgres://%s:%s@/%s?host=/cloudsql/%s&sslmode=disable&pool_max_conns=%d&pool_max_conn_idle_time=60s",
      google_sql_user.relaybus[k].name, urlencode(random_password.database[k].result),
      google_sql_database.relaybus[k].name, local.cloudsql_connection_name, var.cloud_sql.pool_max_conns,
    )
  }

  # The Secret Manager secret id holding each database's URL.
  database_secret_ids = merge(
    { for k, s in google_secret_manager_secret.database_url : k => s.secret_id },
    var.database_url_secrets,
  )

  # Which databases each Cloud Run service opens, as its environment
  # variable => database name (contract: shared/topology Database.EnvVar).
  # publish: main; the relay and dlqreplay: every database; each consume
  # service: its consumer's database, as DATABASE_URL.
  function_databases = {
    publish = { DATABASE_URL = "main" }
    relay   = { for k, d in local.databases : d.env_var => k }
    rollup  = {}
    # dlqreplay reads every database, as the relay does: a consumer with a
    # database of its own keeps its inbox, projections, strict gaps and the
    # outbox of its child events there (dry runs, outbox states, gaps,
    # rebuilds).
    dlqreplay = { for k, d in local.databases : d.env_var => k }
  }
  consume_databases = { for k, c in local.consumers : k => { DATABASE_URL = c.database } }

  # The connection arithmetic above, per database.
  database_connections = {
    for k, d in local.databases : k => var.cloud_sql.pool_max_conns * (
      (k == "main" ? var.publish_settings.max_instances : 0)
      + var.relay_settings.max_instances + var.dlqreplay_settings.max_instances
      + var.consume_settings.max_instances * length([for c in local.consumers : c if c.database == k])
    )
  }
  cloudsql_connections      = sum(concat([0], [for k, n in local.database_connections : n if contains(keys(local.cloudsql_databases), k)]))
  cloudsql_connection_limit = var.cloud_sql.max_connections - var.cloud_sql.reserved_connections
}

resource "google_sql_database_instance" "relaybus" {
  count               = local.use_cloud_sql && var.cloud_sql.create ? 1 : 0
  name                = var.cloud_sql.instance
  region              = local.cloudsql_region
  database_version    = var.cloud_sql.database_version
  deletion_protection = var.deletion_protection

  settings {
    tier                        = var.cloud_sql.tier
    edition                     = var.cloud_sql.edition
    availability_type           = var.cloud_sql.availability_type
    disk_size                   = var.cloud_sql.disk_size_gb
    disk_autoresize             = true
    deletion_protection_enabled = var.deletion_protection

    database_flags {
      name  = "max_connections"
      value = tostring(var.cloud_sql.max_connections)
    }

    # Public IP without authorized networks: reachable only through the
    # Cloud SQL connectors (Cloud Run's volume, the Cloud SQL Auth Proxy for
    # an operator), which authenticate with IAM and encrypt.
    ip_configuration {
      ipv4_enabled = true
      ssl_mode     = "ENCRYPTED_ONLY"
    }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
    }
  }

  depends_on = [time_sleep.api_propagation]
}

data "google_sql_database_instance" "existing" {
  count = local.use_cloud_sql && !var.cloud_sql.create ? 1 : 0
  name  = var.cloud_sql.instance
}

resource "google_sql_database" "relaybus" {
  for_each = local.cloudsql_databases
  name     = local.cloudsql_names[each.key]
  instance = local.cloudsql_instance_name
  # Postgres refuses to drop a database other roles still own objects in.
  deletion_policy = var.deletion_protection ? "ABANDON" : "DELETE"
}

# One user per database, relaybus_<name>. Users created through the Cloud SQL
# API are members of cloudsqlsuperuser
# (https://cloud.google.com/sql/docs/postgres/users), so each can create its
# tables (the functions migrate at start); separate users keep the
# credentials of one database out of the others' services.
resource "random_password" "database" {
  for_each = local.cloudsql_databases
  length   = 32
  special  = false
}

resource "google_sql_user" "relaybus" {
  for_each        = local.cloudsql_databases
  name            = local.cloudsql_names[each.key]
  instance        = local.cloudsql_instance_name
  password        = random_password.database[each.key].result
  deletion_policy = "ABANDON"
}

# The URL secrets. Their values are in Terraform's state too (the provider
# stores secret_data there), so the state bucket is as sensitive as the
# database: keep its access to the deployer.
resource "google_secret_manager_secret" "database_url" {
  for_each  = local.cloudsql_databases
  secret_id = "relaybus-database-url-${each.key}"
  labels    = { database = each.key }

  replication {
    auto {}
  }

  depends_on = [time_sleep.api_propagation]
}

resource "google_secret_manager_secret_version" "database_url" {
  for_each    = local.cloudsql_databases
  secret      = google_secret_manager_secret.database_url[each.key].id
  secret_data = local.cloudsql_urls[each.key]
}

# Refuses a plan whose pools could open more connections than the instance
# accepts (the arithmetic at the top of this file).
resource "terraform_data" "database_connections" {
  input = local.database_connections

  lifecycle {
    precondition {
      condition     = !local.use_cloud_sql || local.cloudsql_connections <= local.cloudsql_connection_limit
      error_message = "The Cloud Run services could open ${local.cloudsql_connections} Postgres connections (pool_max_conns ${var.cloud_sql.pool_max_conns} per instance per database: ${jsonencode(local.database_connections)}), above max_connections ${var.cloud_sql.max_connections} minus ${var.cloud_sql.reserved_connections} reserved. Lower cloud_sql.pool_max_conns or the services' max_instances, or raise cloud_sql.max_connections (and the tier)."
    }
  }
}
