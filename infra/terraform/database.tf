# The Postgres databases of the topology (local.databases): the outbox of
# publish (main) and of every consumer, their inboxes and projections.
#
# Each database is either
#   - in Cloud SQL for PostgreSQL (the default): Terraform creates the
#     instance (or uses an existing one, var.cloud_sql.create = false), one
#     database and one owner user per topology database (its URL in the
#     secret relaybus-database-url-<name>, read by the migrate job only), and
#     one role per function and consumer that uses the database (below,
#     "Roles"); or
#   - elsewhere: var.database_url_secrets names an existing secret whose latest
#     version is the full URL (Terraform neither creates nor reads it); every
#     service of that database uses it, and the separation of roles is the
#     operator's (internal/pgroles says what each needs).
#
# Roles. Cloud SQL makes every user its API creates a member of
# cloudsqlsuperuser with CREATEROLE (https://cloud.google.com/sql/docs/postgres/users);
# before PostgreSQL 16 such a user may grant itself any other non-superuser
# role and set its password, so one consumer's credential could take
# another database's role. So the services never get that user: the owner
# user (relaybus_<name>) owns the tables and is used only by the migrate
# step, a Cloud Run job relaybus-migrate-<name> (the consume image's
# `migrate` command) that Terraform executes on every apply that changes
# the image, the topology or the roles. It applies the migrations, then
# creates or updates, with SQL (so not cloudsqlsuperuser members), one plain
# login role per function and consumer of the database, granted only the
# tables its statements touch (internal/pgroles; CONNECT revoked from
# PUBLIC, so no role reaches another database):
#   relaybus_<db>_publish      main only
#   relaybus_<db>_relay        every database
#   relaybus_<db>_dlqreplay    every database
#   relaybus_<db>_c_<hash>     each consumer whose database it is (<hash>:
#                              12 hex digits of its subscription's sha1, as
#                              its service account id)
#   relaybus_<db>_forwarders   forwarders.database, when the forwarders
#                              service is deployed (forwarders.tf): a consume
#                              role, its registry relaybus_inbox_forwarders
#                              among the inbox tables it is granted
# Each role's URL is in its own secret relaybus-database-url-<db>-<role>,
# readable by its service's account only; the roles and their passwords
# (JSON) in relaybus-database-roles-<db>, readable by the migrate job's
# account only. A role's CONNECTION LIMIT is twice its pools at its
# service's max instances (a new revision's instances start while the old
# ones drain), so one leaked credential cannot take the instance's every
# connection. PostgreSQL 16 is the default version: CREATEROLE no longer
# administers roles its holder did not create, a second wall behind the
# roles' own lack of it.
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
# database by the relay and dlqreplay and its own consumers (and
# forwarders.database by the forwarders service, when it is deployed: its
# forwarders.max_instances on Pub/Sub, its one instance on NATS; dlqreplay's
# max_instances, or on NATS nats.min_instances if that is more). That must
# stay within max_connections − reserved_connections (PostgreSQL keeps
# superuser_reserved_connections, Cloud SQL's own maintenance connects, and an
# operator needs a psql session). With the defaults (pool 5; publish 20,
# dlqreplay 2, relay 3, consume 10 instances each) and the repository's
# topology (3 consumers on main, 1 on member):
#   main   5 × (20 + 2 + 3 + 3×10) = 275
#   member 5 × (2 + 3 + 10)        =  75
#   total 350 ≤ 400 − 20 = 380
# (infra/firstapply_test.go checks these figures, and infra/terraform/README.md's, against
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

  # The URL of each Cloud SQL database as its owner, for the migrate job; it
  # only ever goes into its secret.
  cloudsql_urls = {
    for k, d in local.cloudsql_databases : k => format(
      "postgres://%s:%s@/%s?host=/cloudsql/%s&sslmode=disable&pool_max_conns=%d&pool_max_conn_idle_time=60s",
      google_sql_user.relaybus[k].name, urlencode(random_password.database[k].result),
      google_sql_database.relaybus[k].name, local.cloudsql_connection_name, var.cloud_sql.pool_max_conns,
    )
  }

  # The runtime roles of the Cloud SQL databases (Roles, above), keyed
  # "<database>/<user>": user is publish, relay, dlqreplay or a consumer's
  # subscription. max_instances is its service's.
  database_roles = merge([
    for k, d in local.cloudsql_databases : merge(
      k == "main" ? { "${k}/publish" = { database = k, kind = "publish", consumer = "", slug = "publish", max_instances = var.publish_settings.max_instances } } : {},
      {
        "${k}/relay"     = { database = k, kind = "relay", consumer = "", slug = "relay", max_instances = var.relay_settings.max_instances }
        "${k}/dlqreplay" = { database = k, kind = "dlqreplay", consumer = "", slug = "dlqreplay", max_instances = local.dlqreplay_max_instances }
      },
      {
        for s, c in local.consumers : "${k}/${s}" => {
          database      = k
          kind          = "consume"
          consumer      = s
          slug          = "c-${substr(sha1(s), 0, 12)}"
          max_instances = local.consume_flow[s].max_instances
        } if c.database == k
      },
      # The forwarders service (forwarders.tf): a consume role, on its
      # registry's database only. Its consumer is consume.ForwardersConsumer,
      # which no subscription can be (those have dots).
      local.forwarders_enabled && k == var.forwarders.database ? {
        "${k}/forwarders" = { database = k, kind = "consume", consumer = "forwarders", slug = "forwarders", max_instances = local.forwarders_max_instances }
      } : {},
    )
  ]...)
  database_role_names = { for k, r in local.database_roles : k => "${local.cloudsql_names[r.database]}_${replace(r.slug, "-", "_")}" }

  # Each role's URL; it only ever goes into its secret.
  database_role_urls = {
    for k, r in local.database_roles : k => format(
      "postgres://%s:%s@/%s?host=/cloudsql/%s&sslmode=disable&pool_max_conns=%d&pool_max_conn_idle_time=60s",
      local.database_role_names[k], urlencode(random_password.role[k].result),
      google_sql_database.relaybus[r.database].name, local.cloudsql_connection_name, var.cloud_sql.pool_max_conns,
    )
  }

  # The migrate step's roles of each database (DATABASE_ROLES:
  # pgroles.Role as JSON).
  database_role_specs = {
    for db, d in local.cloudsql_databases : db => [
      for k, r in local.database_roles : {
        name            = local.database_role_names[k]
        kind            = r.kind
        consumer        = r.consumer
        password        = random_password.role[k].result
        connectionLimit = 2 * var.cloud_sql.pool_max_conns * r.max_instances
      } if r.database == db
    ]
  }

  # The secret each service reads a database's URL from, keyed
  # "<database>/<user>" as database_roles: its role's on Cloud SQL, the
  # operator's secret for a database elsewhere.
  role_secret_ids = merge(
    { for k, s in google_secret_manager_secret.role_url : k => s.secret_id },
    merge([
      for db, secret in var.database_url_secrets : merge(
        { "${db}/publish" = secret, "${db}/relay" = secret, "${db}/dlqreplay" = secret },
        { for s, c in local.consumers : "${db}/${s}" => secret if c.database == db },
        local.forwarders_enabled && db == var.forwarders.database ? { "${db}/forwarders" = secret } : {},
      )
    ]...),
  )

  # The Secret Manager secret id holding each database's URL.
  database_secret_ids = merge(
    { for k, s in google_secret_manager_secret.database_url : k => s.secret_id },
    var.database_url_secrets,
  )

  # Which databases each Cloud Run service opens, as its environment
  # variable => database name (contract: shared/topology Database.EnvVar);
  # the secret of each is local.role_secret_ids["<database>/<function>"].
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
      + var.relay_settings.max_instances + local.dlqreplay_max_instances
      + sum(concat([0], [for s, c in local.consumers : local.consume_flow[s].max_instances if c.database == k]))
      + (local.forwarders_enabled && k == var.forwarders.database ? local.forwarders_max_instances : 0)
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

# One owner user per database, relaybus_<name>: a member of cloudsqlsuperuser
# (https://cloud.google.com/sql/docs/postgres/users), it creates the tables
# and the runtime roles in the migrate job, and no service holds it.
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

# The owner URL secrets (the migrate job's). Their values are in Terraform's
# state too (the provider stores secret_data there), so the state bucket is
# as sensitive as the database: keep its access to the deployer.
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

# The runtime roles' passwords and URL secrets (Roles, above).
resource "random_password" "role" {
  for_each = local.database_roles
  length   = 32
  special  = false
}

resource "google_secret_manager_secret" "role_url" {
  for_each  = local.database_roles
  secret_id = "relaybus-database-url-${each.value.database}-${each.value.slug}"
  labels    = { database = each.value.database, role = each.value.kind }

  replication {
    auto {}
  }

  depends_on = [time_sleep.api_propagation]
}

resource "google_secret_manager_secret_version" "role_url" {
  for_each    = local.database_roles
  secret      = google_secret_manager_secret.role_url[each.key].id
  secret_data = local.database_role_urls[each.key]
}

# Each database's roles with their passwords, for its migrate job only.
resource "google_secret_manager_secret" "database_roles" {
  for_each  = local.cloudsql_databases
  secret_id = "relaybus-database-roles-${each.key}"
  labels    = { database = each.key }

  replication {
    auto {}
  }

  depends_on = [time_sleep.api_propagation]
}

resource "google_secret_manager_secret_version" "database_roles" {
  for_each    = local.cloudsql_databases
  secret      = google_secret_manager_secret.database_roles[each.key].id
  secret_data = jsonencode(local.database_role_specs[each.key])
}

# The migrate step, one job per Cloud SQL database: the consume image's
# `migrate` command (consume.MigrateDatabase) as the database's owner.
resource "google_cloud_run_v2_job" "migrate" {
  for_each            = local.cloudsql_databases
  name                = "relaybus-migrate-${each.key}"
  location            = var.region
  deletion_protection = var.deletion_protection

  template {
    task_count = 1
    template {
      service_account = google_service_account.migrate.email
      max_retries     = 3
      timeout         = "600s"

      volumes {
        name = "cloudsql"
        cloud_sql_instance {
          instances = [local.cloudsql_connection_name]
        }
      }

      containers {
        image = local.images["consume"]
        args  = ["migrate"]

        dynamic "env" {
          for_each = {
            GOOGLE_CLOUD_PROJECT = var.project_id
            RELAYBUS_TOPOLOGY    = local.topology_in_image
            LOG_LEVEL            = var.log_level
            MIGRATE_DATABASE     = each.key
          }
          content {
            name  = env.key
            value = env.value
          }
        }

        dynamic "env" {
          for_each = {
            DATABASE_URL   = google_secret_manager_secret.database_url[each.key].secret_id
            DATABASE_ROLES = google_secret_manager_secret.database_roles[each.key].secret_id
          }
          content {
            name = env.key
            value_source {
              secret_key_ref {
                secret  = env.value
                version = "latest"
              }
            }
          }
        }

        volume_mounts {
          name       = "cloudsql"
          mount_path = "/cloudsql"
        }
      }
    }
  }

  depends_on = [terraform_data.topology, time_sleep.iam_propagation]
}

# Executed by the machine applying Terraform before the services start
# (they depend on it): the tables migrated and the roles in place. Re-run
# when the image, the topology or a role (its secret's version) changes.
resource "terraform_data" "migrate" {
  for_each = local.cloudsql_databases
  triggers_replace = [
    local.topology_hash, local.images["consume"],
    google_secret_manager_secret_version.database_roles[each.key].id,
    google_secret_manager_secret_version.database_url[each.key].id,
  ]

  depends_on = [time_sleep.iam_propagation, google_cloud_run_v2_job.migrate]

  provisioner "local-exec" {
    command = "${var.gcloud} run jobs execute ${google_cloud_run_v2_job.migrate[each.key].name} --project=${var.project_id} --region=${var.region} --wait"
  }
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
