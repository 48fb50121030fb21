// Package infra holds the checks of relaybus's deployment files that run
// without Google Cloud or Terraform providers (its tests, in `make test`):
//
//   - infra/terraform is parsed with hashicorp/hcl/v2 and its locals are
//     evaluated with Terraform's own functions (yamldecode from go-cty-yaml,
//     cty's stdlib, tryfunc), with stand-ins for the attributes of created
//     resources (stubs_test.go), and compared with topology.Load, for the
//     repository's topology and for edge-case topologies; when a terraform
//     binary is available, `terraform console` evaluates the topology locals
//     too and must agree;
//   - the invariants of the issues: every push consumer subscription has
//     ordering, a dead-letter policy, a retry policy and the replay filter;
//     every Eventarc subscription gets its dead-letter and retry policy by the
//     gcloud step, and maps to its logical subscription for dlqreplay; every
//     <topic>.dlq-monitor pushes to dlqreplay's /deadletters:archive; every
//     outbox database has its URL secret and its relay Scheduler job; every
//     service that opens a Cloud SQL database mounts the Cloud SQL volume and
//     holds Cloud SQL Client, and the pools fit max_connections; the service
//     agents exist and every wait for propagation stands before what needs
//     it; every alert's aligner suits its metric's kind; the ledger's TTL
//     policies; the naming rules refuse what shared/topology refuses; nothing
//     is public; every service account has exactly the roles documented in
//     infra/terraform/README.md; Cloud Run env matches each function's Config;
//   - cloudbuild.yaml's step graph and test image, the build account's roles,
//     infra/docker/Dockerfile and .dockerignore, `terraform fmt -check`, and a
//     static linux/amd64 build of every function.
package infra
