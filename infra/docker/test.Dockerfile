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
#   - Chromium (Debian's chromium) for the console's headless browser tests;
#   - make and git (make test runs gofmt over `git ls-files`).
#
# Built by cloudbuild.yaml (step test-image) and pushed to the images'
# Artifact Registry repository as relaybus-test, so the next build reuses its
# layers. Google's apt repository for the Cloud SDK:
# https://cloud.google.com/sdk/docs/install#deb

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS go

FROM debian:bookworm-slim
ARG CLOUD_SDK_VERSION=528.0.0-0

COPY --from=go /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:/root/go/bin:$PATH

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates curl gnupg git make \
      openjdk-17-jre-headless \
      postgresql-15 \
      chromium \
 && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
 && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" > /etc/apt/sources.list.d/google-cloud-sdk.list \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      google-cloud-cli=${CLOUD_SDK_VERSION} \
      google-cloud-cli-pubsub-emulator=${CLOUD_SDK_VERSION} \
      google-cloud-cli-firestore-emulator=${CLOUD_SDK_VERSION} \
 && rm -rf /var/lib/apt/lists/* \
 && go version && java -version && /usr/lib/postgresql/15/bin/initdb --version && chromium --version

WORKDIR /workspace
