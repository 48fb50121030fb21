output "service_urls" {
  description = "URL of each function's Cloud Run service (publish, relay, rollup, dlqreplay). The operator's CLI: relaybus -url <dlqreplay> -gcloud-auth events ls."
  value       = { for k, s in google_cloud_run_v2_service.function : k => s.uri }
}

output "dlqreplay_url" {
  description = "The operations API's deterministic URL, the audience its callers' ID tokens must have (DLQREPLAY_AUDIENCE): relaybus -url <this> -gcloud-auth events ls."
  value       = local.function_urls["dlqreplay"]
}

output "consume_services" {
  description = "Each consumer subscription id with its consume service and URL."
  value       = { for k, s in google_cloud_run_v2_service.consume : k => { service = s.name, url = s.uri } }
}

output "subscriptions" {
  description = "Each consumer's logical subscription id => the subscription id Pub/Sub uses (the same for push consumers, the trigger's generated eventarc-... subscription for Eventarc consumers). dlqreplay reads the same map as DLQREPLAY_SUBSCRIPTIONS."
  value       = local.consumer_subscription_ids
}

output "dead_letter_topics" {
  description = "The <topic>.dlq topic of each topic."
  value       = { for k, t in google_pubsub_topic.dead_letter : k => t.id }
}

output "databases" {
  description = "Each topology database: the Secret Manager secret holding its URL (on Cloud SQL the owner's, which only the migrate job reads; each service's role has its own secret, database.tf), where it lives (cloudsql or external) and, for Cloud SQL, the Postgres database name."
  value = {
    for k, d in local.databases : k => {
      secret   = local.database_secret_ids[k]
      env_var  = d.env_var
      location = contains(keys(local.cloudsql_databases), k) ? "cloudsql" : "external"
      database = lookup(local.cloudsql_names, k, null)
    }
  }
}

output "cloud_sql_instance" {
  description = "The Cloud SQL instance connection name (<project>:<region>:<instance>), empty when every database is external. For psql: cloud-sql-proxy <name>."
  value       = local.cloudsql_connection_name
}

output "service_accounts" {
  description = "Service account email of each function and consumer, the Scheduler's, the DLQ monitors' push identity and, with forwarders, the forwarders service's and (on Pub/Sub) its pushes' identity."
  value = merge(
    { for k, a in google_service_account.function : k => a.email },
    { for k, a in google_service_account.consume : "consume:${k}" => a.email },
    { scheduler = google_service_account.scheduler.email, dead_letter_push = google_service_account.dead_letter_push.email },
    { for i, a in google_service_account.forwarders : "forwarders" => a.email },
    { for i, a in google_service_account.forwarders_push : "forwarders_push" => a.email },
  )
}

output "forwarders" {
  description = "The forwarders consume service (forwarders.enabled only; null otherwise): its name, its URL (on Pub/Sub, each forwarder's subscription pushes to <url>/<name>) and the push identity (null on NATS, where the service pulls)."
  value = local.forwarders_enabled ? {
    service      = google_cloud_run_v2_service.forwarders[0].name
    url          = local.forwarders_url
    push_account = local.forwarders_push ? google_service_account.forwarders_push[0].email : null
  } : null
}
