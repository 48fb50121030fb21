# The image cloudbuild.yaml's test step runs `make test` in: everything the
# suite needs, as on a developer's machine (.ci/run installs the same on a
# fresh Debian):
#   - Go 1.26 (the toolchain copied from the official image; it is statically
#     linked, so it runs on this Debian);
#   - Java 17 and the gcloud Pub/Sub and Firestore emulators, which
#     internal/emulator starts directly (their jars under
#     /usr/lib/google-cloud-sdk/platform). The Cloud SDK is pinned to the
#     version the suite is tested with: newer Firestore emulators may want a
#     newer Java;
#   - PostgreSQL 15 binaries (Debian 12's postgresql-15): internal/cmd/testenv
#     starts a throwaway cluster with max_connections=400, the suite's need,
#     running it as the package's "postgres" user since the step runs as root;
#   - PgBouncer (Debian's pgbouncer): testenv puts it in transaction mode in
#     front of that cluster, and the pooler pass of the suite runs through it;
#   - Terraform 1.5.7 (copied from HashiCorp's image): the tests that run the
#     CLI (fmt, console) need it; with CI=true a missing one fails them;
#   - Chromium (Debian's chromium) for the console's headless browser tests;
#   - make and git (make test runs gofmt over `git ls-files`).
#
# Built by cloudbuild.yaml (step test-image) and pushed to the images'
# Artifact Registry repository as relaybus-test:<commit>. Google's apt
# repository for the Cloud SDK: https://cloud.google.com/sdk/docs/install#deb
#
# Every base is pinned by digest (tag@sha256:...): infra/docker/pin-images.sh
# resolves the tags again and rewrites the digests. The Go tag is go.mod's
# go version (infra/cloudbuild_test.go).

FROM golang:1.26@sha256:3aff6657219a4d9c14e27fb1d8976c49c29fddb70ba835014f477e1c70636647 AS go

FROM hashicorp/terraform:1.5.7@sha256:9fc0d70fb0f858b0af1fadfcf8b7510b1b61e8b35e7a4bb9ff39f7f6568c321d AS terraform

FROM debian:bookworm-slim@sha256:96e378d7e6531ac9a15ad505478fcc2e69f371b10f5cdf87857c4b8188404716
ARG CLOUD_SDK_VERSION=528.0.0-0

COPY --from=go /usr/local/go /usr/local/go
COPY --from=terraform /bin/terraform /usr/local/bin/terraform
ENV PATH=/usr/local/go/bin:/root/go/bin:$PATH

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates curl gnupg git make \
      openjdk-17-jre-headless \
      postgresql-15 pgbouncer \
      chromium \
 && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
 && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" > /etc/apt/sources.list.d/google-cloud-sdk.list \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      google-cloud-cli=${CLOUD_SDK_VERSION} \
      google-cloud-cli-pubsub-emulator=${CLOUD_SDK_VERSION} \
      google-cloud-cli-firestore-emulator=${CLOUD_SDK_VERSION} \
 && rm -rf /var/lib/apt/lists/* \
 && go version && java -version && /usr/lib/postgresql/15/bin/initdb --version && pgbouncer --version && terraform version && chromium --version

WORKDIR /workspace
