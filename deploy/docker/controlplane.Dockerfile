# Control-plane image: taskrunnerd (all four services, `taskrunnerd migrate`), gateway and
# taskctl, plus grpc_health_probe for Compose healthchecks (Kubernetes probes gRPC natively).
#
# Build from the repository root (the context must hold go.work and every module):
#   docker build -f deploy/docker/controlplane.Dockerfile -t ghcr.io/taskrunner/taskrunner:0.1.0 .
#
# Nothing is fetched from a URL: Go modules come from the Go module proxy, the base images
# from the registry, both pinned. Bump the tags deliberately (and the Compose/Kubernetes/Fly
# image references with them).

FROM golang:1.26.8-trixie AS build
WORKDIR /src
COPY go.work go.work.sum ./
COPY proto/ proto/
COPY services/ services/
COPY gateway/ gateway/
COPY runner/ runner/
COPY tools/ tools/
# Static binaries (no cgo) so the runtime image needs no libc beyond musl's ca bundle.
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags="-s -w" -o /out/ \
      ./services/cmd/taskrunnerd ./gateway/cmd/gateway ./tools/cmd/taskctl
# grpc_health_probe from the Go module proxy (pinned), built the same way.
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN=/out go install -trimpath -ldflags="-s -w" \
      github.com/grpc-ecosystem/grpc-health-probe@v0.4.63 \
 && mv /out/grpc-health-probe /out/grpc_health_probe

# Alpine rather than distroless: its busybox `wget` serves the gateway's Compose healthcheck
# and the image stays about 30 MB.
FROM alpine:3.22.2
# /var/lib/taskrunner/pki is created owned by the runtime user so that a fresh named volume
# mounted there (Compose `pki`) inherits the ownership and `taskctl pki init` can write it.
RUN mkdir -p /var/lib/taskrunner/pki && chown -R 65532:65532 /var/lib/taskrunner
COPY --from=build /out/ /usr/local/bin/
# Containers listen on every interface; the binaries' defaults (127.0.0.1) suit a laptop.
ENV TASKRUNNER_GRPC_ADDR=:7070 \
    TASKRUNNER_RUNNER_GRPC_ADDR=:7443 \
    TASKRUNNER_HTTP_ADDR=:8080
EXPOSE 7070 7443 8080
USER 65532:65532
# One image, three binaries: Compose `command:`, Kubernetes `command:` and Fly `[processes]`
# choose taskrunnerd, gateway or taskctl.
CMD ["taskrunnerd"]
