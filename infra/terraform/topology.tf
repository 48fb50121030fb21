# The topology: infra/topology.yaml, read with yamldecode and given the same
# defaults shared/topology.Load applies, so Terraform, the local stack and the
# ledger's topic_consumers seeding see the same topics and consumers.
# infra/infra_test.go evaluates these locals and checks them against
# topology.Load (subscriptions, filters, delivery settings, dead-letter topics).
#
# Only var.*, path.module and local.* may be used in this file: the tests
# evaluate it on its own.

locals {
  topology_path = coalesce(var.topology_file, "${path.module}/../topology.yaml")
  topology      = yamldecode(file(local.topology_path))
  topology_hash = sha1(file(local.topology_path))

  # shared/topology's built-in defaults (the company's Pub/Sub conventions); the
  # file's `defaults` section overrides them. As in shared/topology, 0 and ""
  # mean "not set".
  builtin_defaults = {
    ack_deadline_seconds      = 60
    message_retention_seconds = 604800
    min_backoff_seconds       = 10
    max_backoff_seconds       = 600
    max_delivery_attempts     = 5
    delivery                  = "push"
    role                      = "processor"
    handler                   = "projection"
    encoding                  = "json"
    # Flow control (topology max_in_flight, max_per_second, max_instances):
    # 0 is unset, so consume_settings and pull_mode decide (consume_flow).
    max_in_flight  = 0
    max_per_second = 0
    max_instances  = 0
  }
  defaults = {
    for k, d in local.builtin_defaults : k => (
      try(local.topology.defaults[k], null) == null || try(local.topology.defaults[k], null) == 0 || try(local.topology.defaults[k], null) == ""
      ? d : local.topology.defaults[k]
    )
  }

  rollup = {
    topic        = local.topology.rollup.topic
    delivery     = coalesce(try(local.topology.rollup.delivery, null), "push")
    subscription = "${local.topology.rollup.topic}.rollup-processor"
  }

  relay = {
    schedule                 = coalesce(try(local.topology.relay.schedule, null), "* * * * *")
    time_budget_seconds      = try(local.topology.relay.time_budget_seconds > 0 ? local.topology.relay.time_budget_seconds : 45, 45)
    attempt_deadline_seconds = try(local.topology.relay.attempt_deadline_seconds > 0 ? local.topology.relay.attempt_deadline_seconds : 120, 120)
  }

  # Topics by name.
  topics = {
    for t in local.topology.topics : t.name => {
      name                      = t.name
      description               = try(t.description, null) != null ? t.description : ""
      encoding                  = coalesce(try(t.encoding, null), local.defaults.encoding)
      message_retention_seconds = try(t.message_retention_seconds > 0 ? t.message_retention_seconds : local.defaults.message_retention_seconds, local.defaults.message_retention_seconds)
      dead_letter_topic         = "${t.name}.dlq"
      dead_letter_monitor       = "${t.name}.dlq-monitor"
    }
  }

  # The topics with a Pub/Sub schema (topology schemas of type protobuf or
  # avro; a jsonschema topic has none: Pub/Sub has no such type and only
  # relaybus's send paths check it). files lists the versions' schema files
  # oldest version first (v2 before v10); the last is the schema's
  # definition. encoding is the topic's schema_settings encoding.
  topic_schemas = {
    for t in local.topology.topics : t.name => {
      pubsub_type = t.schemas[0].type == "protobuf" ? "PROTOCOL_BUFFER" : "AVRO"
      gcloud_type = t.schemas[0].type == "protobuf" ? "protocol-buffer" : "avro"
      encoding    = upper(coalesce(try(t.schemas[0].encoding, null), t.schemas[0].type == "avro" ? "binary" : "json"))
      versions    = [for k in sort([for s in t.schemas : format("%08d", tonumber(substr(s.version, 1, -1)))]) : "v${tonumber(k)}"]
      files = [
        for k in sort([for s in t.schemas : format("%08d", tonumber(substr(s.version, 1, -1)))]) :
        "${dirname(local.topology_path)}/${[for s in t.schemas : s.file if format("%08d", tonumber(substr(s.version, 1, -1))) == k][0]}"
      ]
    } if length(flatten([try(t.schemas, [])])) > 0 && try(t.schemas[0].type, "") != "jsonschema"
  }

  # Every consumer with its settings resolved, before the names derived from them.
  consumer_list = flatten([
    for t in local.topology.topics : [
      for c in flatten([try(t.consumers, [])]) : {
        topic                                = t.name
        service                              = c.service
        role                                 = coalesce(try(c.role, null), local.defaults.role)
        description                          = try(c.description, null) != null ? c.description : ""
        delivery                             = coalesce(try(c.delivery, null), local.defaults.delivery)
        handler                              = coalesce(try(c.handler, null), local.defaults.handler)
        forward_url                          = try(c.forward_url, null) != null ? c.forward_url : ""
        forward_auth                         = coalesce(try(c.forward_auth, null), "none")
        forward_audience                     = try(c.forward_audience, null) != null ? c.forward_audience : ""
        forward_secret                       = try(c.forward_secret, null) != null ? c.forward_secret : ""
        forward_timeout_seconds              = try(c.forward_timeout_seconds > 0 ? c.forward_timeout_seconds : 10, 10)
        forward_breaker_threshold            = try(c.forward_breaker_threshold != 0 ? c.forward_breaker_threshold : 5, 5)
        forward_breaker_cooldown_seconds     = try(c.forward_breaker_cooldown_seconds > 0 ? c.forward_breaker_cooldown_seconds : 5, 5)
        forward_breaker_max_cooldown_seconds = try(c.forward_breaker_max_cooldown_seconds > 0 ? c.forward_breaker_max_cooldown_seconds : 300, 300)
        forward_probe                        = try(c.forward_probe, null) != null ? c.forward_probe : ""
        gap_timeout_seconds                  = try(c.gap_timeout_seconds > 0 ? c.gap_timeout_seconds : 600, 600)
        extra_filter                         = try(c.filter, null) != null ? c.filter : ""
        enabled                              = try(c.enabled, null) != null ? c.enabled : true
        ack_deadline_seconds                 = try(c.ack_deadline_seconds > 0 ? c.ack_deadline_seconds : local.defaults.ack_deadline_seconds, local.defaults.ack_deadline_seconds)
        min_backoff_seconds                  = try(c.min_backoff_seconds > 0 ? c.min_backoff_seconds : local.defaults.min_backoff_seconds, local.defaults.min_backoff_seconds)
        max_backoff_seconds                  = try(c.max_backoff_seconds > 0 ? c.max_backoff_seconds : local.defaults.max_backoff_seconds, local.defaults.max_backoff_seconds)
        max_delivery_attempts                = try(c.max_delivery_attempts > 0 ? c.max_delivery_attempts : local.defaults.max_delivery_attempts, local.defaults.max_delivery_attempts)
        message_retention_seconds            = local.topics[t.name].message_retention_seconds
        database                             = coalesce(try(c.database, null), "main")
        emits                                = [for e in flatten([try(c.emits, [])]) : e if e != null]
        max_in_flight                        = try(c.max_in_flight > 0 ? c.max_in_flight : local.defaults.max_in_flight, local.defaults.max_in_flight)
        max_per_second                       = try(c.max_per_second > 0 ? c.max_per_second : local.defaults.max_per_second, local.defaults.max_per_second)
        max_instances                        = try(c.max_instances > 0 ? c.max_instances : local.defaults.max_instances, local.defaults.max_instances)
      } if c != null
    ]
  ])

  # Consumers by subscription id (<topic>.<service>-<role>, internal/names).
  # replay_filter is topology.Consumer.ReplayFilter: a re-push or dead-letter
  # replay addressed (target_consumer) to another consumer does not reach this
  # one. filter is topology.Consumer.Filter.
  consumers = {
    for c in local.consumer_list : "${c.topic}.${c.service}-${c.role}" => merge(c, {
      subscription      = "${c.topic}.${c.service}-${c.role}"
      dead_letter_topic = "${c.topic}.dlq"
      replay_filter     = "NOT attributes:target_consumer OR attributes.target_consumer = \"${c.service}\""
      filter = (c.extra_filter == ""
        ? "NOT attributes:target_consumer OR attributes.target_consumer = \"${c.service}\""
        : "(${c.extra_filter}) AND (NOT attributes:target_consumer OR attributes.target_consumer = \"${c.service}\")"
      )
      # Cloud Run service names are at most 49 characters: a readable prefix
      # and a hash of the subscription, which is unique.
      run_service = "consume-${trimsuffix(substr("${c.service}-${c.role}", 0, 31), "-")}-${substr(sha1("${c.topic}.${c.service}-${c.role}"), 0, 8)}"
      # Service account ids are 6 to 30 characters.
      account_id = "rb-consume-${substr(sha1("${c.topic}.${c.service}-${c.role}"), 0, 12)}"
    })
  }

  # Each consumer's child-event topics (topology emits): its service account
  # publishes the children right after commit, so it is a publisher on
  # each (iam.tf, consume_emits). Keyed "<subscription> <topic>".
  consumer_emits = merge([
    for k, c in local.consumers : { for e in c.emits : "${k} ${e}" => { consumer = k, topic = e } }
  ]...)

  # Every topic's publishers (topology publishers) as IAM members: Cloud
  # Run must admit them to publish before publish checks the topic
  # (iam.tf, topology_publishers). A bare email is a service account's when
  # it ends in .gserviceaccount.com, else a user's.
  topology_publishers = toset(flatten([
    for t in local.topology.topics : [
      for p in flatten([try(t.publishers, [])]) : (
        length(regexall("^(serviceAccount|user):", p)) > 0 ? p :
        length(regexall("\\.gserviceaccount\\.com$", p)) > 0 ? "serviceAccount:${p}" : "user:${p}"
      ) if p != null
    ]
  ]))

  # The topology's operators (operators:) as IAM members: Cloud Run must
  # admit them to dlqreplay, which reads their roles from the same file
  # (iam.tf, operators). A bare email is a service account's when it ends in
  # .gserviceaccount.com, else a user's.
  topology_operators = toset([
    for o in try(local.topology.operators, []) : (
      length(regexall("^(serviceAccount|user|group):", o.member)) > 0 ? o.member :
      length(regexall("\\.gserviceaccount\\.com$", o.member)) > 0 ? "serviceAccount:${o.member}" : "user:${o.member}"
    ) if try(o.member, null) != null
  ])

  # Pull mode (var.pull_mode, pull.tf): these consumers pull a subscription of
  # their own and have neither a push subscription nor an Eventarc trigger.
  # On NATS (nats.tf) every consumer pulls.
  pull_consumers = {
    for k, c in local.consumers : k => c
    if var.nats != null || (var.pull_mode.enabled && (length(var.pull_mode.consumers) == 0 || contains(var.pull_mode.consumers, k)))
  }
  # Each consumer's flow control as its consume service runs it (run.tf):
  # max_instances, its Cloud Run max instances (the topology's, else
  # pull_mode.max_instances for a pull consumer, else
  # consume_settings.max_instances); concurrency, its container
  # concurrency (max_in_flight, else consume_settings.concurrency);
  # CONSUMER_MAX_IN_FLIGHT (max_in_flight, 0 unset) and
  # CONSUMER_MAX_PER_SECOND, each instance's even share of max_per_second
  # (topology.Consumer.InstancePerSecond; 0 no limit).
  consume_flow = {
    for k, c in local.consumers : k => {
      max_instances = c.max_instances > 0 ? c.max_instances : (contains(keys(local.pull_consumers), k) ? var.pull_mode.max_instances : var.consume_settings.max_instances)
      concurrency   = c.max_in_flight > 0 ? c.max_in_flight : var.consume_settings.concurrency
      max_in_flight = c.max_in_flight
      per_second = c.max_per_second > 0 ? c.max_per_second / (
        c.max_instances > 0 ? c.max_instances : (contains(keys(local.pull_consumers), k) ? var.pull_mode.max_instances : var.consume_settings.max_instances)
      ) : 0
    }
  }
  push_consumers = { for k, c in local.consumers : k => c if c.delivery == "push" && !contains(keys(local.pull_consumers), k) }
  # The forward consumers delivered by ordered push whose circuit breaker
  # pauses their own subscription while the target is down (scheduler.tf's
  # breaker_probe resumes it; iam.tf's consume_push_control lets it).
  breaker_pause_consumers = { for k, c in local.push_consumers : k => c if c.handler == "forward" && c.forward_breaker_threshold >= 0 }
  eventarc_consumers      = { for k, c in local.consumers : k => c if c.delivery == "eventarc" && !contains(keys(local.pull_consumers), k) }
  # The forward consumers delivered by Eventarc, whose circuit breaker pauses
  # them by their own flag while the target is down (deliveries kept in their
  # database): scheduler.tf's breaker_probe resumes them and iam.tf's
  # consume_republish lets them publish the kept deliveries again.
  breaker_flag_consumers  = { for k, c in local.eventarc_consumers : k => c if c.handler == "forward" && c.forward_breaker_threshold >= 0 }
  breaker_probe_consumers = merge(local.breaker_pause_consumers, local.breaker_flag_consumers)

  # The Postgres databases that hold an outbox (topology.Topology.Databases):
  # main when the file declares none. env_var is topology.Database.EnvVar:
  # DATABASE_URL for main, DATABASE_URL_<NAME> (upper case, - as _) for the
  # others. Each gets its own Secret Manager secret (database.tf) and its own
  # relay Scheduler job (scheduler.tf).
  declared_databases = [
    for d in flatten([try(local.topology.databases, [])]) : {
      name        = d.name
      description = try(d.description, null) != null ? d.description : ""
    } if d != null
  ]
  database_list = length(local.declared_databases) > 0 ? local.declared_databases : [
    { name = "main", description = "The outbox of the publish function and of every consumer." },
  ]
  databases = {
    for d in local.database_list : d.name => merge(d, {
      env_var = d.name == "main" ? "DATABASE_URL" : "DATABASE_URL_${upper(replace(d.name, "-", "_"))}"
    })
  }

  # The naming rules of internal/names and shared/topology, checked again here
  # so that a topology edited without running the Go tests is refused at plan
  # time (terraform_data.topology's precondition, main.tf) with the rule,
  # before anything is created:
  #   topic          <domain>.<aggregate>.<category>: 2 or 3 dot-separated
  #                  segments of [a-z0-9-] starting with a letter, each at most
  #                  63 characters, none of them "dlq", at most 200 in all
  #   subscription   <topic>.<service>-<role>: service [a-z][a-z0-9-]* (at most
  #                  63, not ending in -), role [a-z][a-z0-9]* (at most 30), at
  #                  most 255 characters in all (Pub/Sub's limit)
  #   database       [a-z][a-z0-9-]* at most 30 characters, not ending in -;
  #                  main declared; every consumer's database declared
  topic_rule        = "a topic is <domain>.<aggregate>.<category>: 2 or 3 dot-separated segments of [a-z0-9-] starting with a letter, at most 200 characters (e.g. shop.order.events)"
  subscription_rule = "a subscription is <topic>.<consumer_service>-<role>: service 1 to 63 characters of [a-z0-9-] starting with a letter and not ending with a hyphen, role 1 to 30 characters of [a-z0-9] starting with a letter, at most 255 characters in all"
  database_rule     = "a database name is a lowercase letter, then lowercase letters, digits or -, at most 30 characters, not ending with -"
  topic_names       = concat([for t in local.topology.topics : t.name], [local.topology.rollup.topic])
  naming_errors = concat(
    [
      for n in local.topic_names : "topic \"${n}\": ${local.topic_rule}"
      if length(n) > 200 || length(regexall("^[a-z][a-z0-9-]{0,62}(\\.[a-z][a-z0-9-]{0,62}){1,2}$", n)) == 0 || contains(split(".", n), "dlq")
    ],
    [
      for c in local.consumer_list : "subscription \"${c.topic}.${c.service}-${c.role}\": ${local.subscription_rule}"
      if length(regexall("^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", c.service)) == 0 || length(regexall("^[a-z][a-z0-9]{0,29}$", c.role)) == 0 || length("${c.topic}.${c.service}-${c.role}") > 255
    ],
    [
      for d in local.database_list : "database \"${d.name}\": ${local.database_rule}"
      if length(regexall("^[a-z]([a-z0-9-]{0,28}[a-z0-9])?$", d.name)) == 0
    ],
    contains([for d in local.database_list : d.name], "main") ? [] : ["databases: must declare \"main\", the publish function's database"],
    [
      for c in local.consumer_list : "consumer ${c.topic}.${c.service}-${c.role}: database \"${c.database}\" is not one of the topology's databases"
      if !contains([for d in local.database_list : d.name], c.database)
    ],
    flatten([
      for t in local.topology.topics : [
        for p in flatten([try(t.publishers, [])]) : "topic \"${t.name}\": publisher \"${p}\" must be an email (serviceAccount: or user: prefix allowed)"
        if p != null && length(regexall("^((serviceAccount|user):)?[^:@, ]+@[^:@, ]+$", p)) == 0
      ]
    ]),
    flatten([
      for c in local.consumer_list : [
        for e in c.emits : "consumer ${c.topic}.${c.service}-${c.role}: emits \"${e}\" is not one of the topology's topics"
        if !contains([for t in local.topology.topics : t.name], e)
      ]
    ]),
  )
}
