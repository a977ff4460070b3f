# Multi-stage build of the proxy: a static binary on a minimal base image.
# The two base images are build arguments: the defaults are the public ones users pull;
# e2e/docker (which runs this file for real, without a registry) passes images it built locally.
ARG BUILD_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/pulsar-rebatch-proxy ./cmd/proxy

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/pulsar-rebatch-proxy /usr/local/bin/pulsar-rebatch-proxy
EXPOSE 6650 9090
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/pulsar-rebatch-proxy"]
