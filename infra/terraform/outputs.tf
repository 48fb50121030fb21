output "service_urls" {
  description = "URL of each function's Cloud Run service (publish, relay, rollup, dlqreplay)."
  value       = { for k, s in google_cloud_run_v2_service.function : k => s.uri }
}

output "consume_services" {
  description = "Each consumer subscription id with its consume service and URL."
  value       = { for k, s in google_cloud_run_v2_service.consume : k => { service = s.name, url = s.uri } }
}

output "subscriptions" {
  description = "Each consumer's Pub/Sub subscription: the topology name for push consumers, the trigger's generated subscription for Eventarc consumers."
  value = merge(
    { for k, s in google_pubsub_subscription.consumer : k => s.id },
    { for k, t in google_eventarc_trigger.consumer : k => t.transport[0].pubsub[0].subscription },
  )
}

output "dead_letter_topics" {
  description = "The <topic>.dlq topic of each topic."
  value       = { for k, t in google_pubsub_topic.dead_letter : k => t.id }
}

output "service_accounts" {
  description = "Service account email of each function and consumer."
  value = merge(
    { for k, a in google_service_account.function : k => a.email },
    { for k, a in google_service_account.consume : "consume:${k}" => a.email },
    { scheduler = google_service_account.scheduler.email },
  )
}
