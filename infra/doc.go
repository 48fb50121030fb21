// Package infra holds the checks of relaybus's deployment files that run
// without Google Cloud or Terraform providers (its tests, in `make test`):
//
//   - infra/terraform is parsed with hashicorp/hcl/v2 and its topology locals
//     are evaluated with Terraform's own functions (yamldecode from
//     go-cty-yaml, cty's stdlib, tryfunc) and compared with topology.Load, for
//     the repository's topology and for edge-case topologies; when a terraform
//     binary is available, `terraform console` evaluates them too and must
//     agree;
//   - the invariants of the issue: every push consumer subscription has
//     ordering, a dead-letter policy, a retry policy and the replay filter;
//     every Eventarc subscription gets its dead-letter and retry policy by
//     the gcloud step; every dead-letter topic has the Pub/Sub service agent's
//     publisher grant; nothing is public; every service account has exactly
//     the roles documented in infra/terraform/README.md; every ledger index
//     in infra/firestore/indexes.yaml is created; the log-based metrics match
//     the relay's log messages;
//   - cloudbuild.yaml's step graph, infra/docker/Dockerfile, `terraform fmt -check`,
//     and a static linux/amd64 build of every function.
package infra
