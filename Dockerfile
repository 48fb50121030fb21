# One image per function:
#   docker build --build-arg FUNCTION=relay -t relaybus-relay .
# FUNCTION is publish, relay, consume, rollup or dlqreplay. The binary is a
# static linux build of ./functions/$FUNCTION/cmd (functions-framework-go
# serving on $PORT, FUNCTION_TARGET defaults to the function), run as a
# non-root user on distroless. The topology file is baked in at
# /etc/relaybus/topology.yaml: Terraform reads the same file from the same
# checkout, so the image and the infrastructure agree.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
ARG FUNCTION
RUN test -n "$FUNCTION" || (echo "build with --build-arg FUNCTION=publish|relay|consume|rollup|dlqreplay" >&2; exit 1)
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux GOARCH=amd64 \
    go build -trimpath -ldflags="-s -w" -o /out/function ./functions/${FUNCTION}/cmd

FROM gcr.io/distroless/static-debian12:nonroot
ARG FUNCTION
COPY --from=build /out/function /function
COPY infra/topology.yaml /etc/relaybus/topology.yaml
ENV RELAYBUS_TOPOLOGY=/etc/relaybus/topology.yaml \
    FUNCTION_TARGET=${FUNCTION} \
    PORT=8080
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/function"]
