# Multi-stage build of the proxy: a static binary on a minimal base image.
# (No Docker engine runs on the project's CI machines; this file is kept correct by reading.)
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/pulsar-rebatch-proxy ./cmd/proxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pulsar-rebatch-proxy /usr/local/bin/pulsar-rebatch-proxy
EXPOSE 6650 9090
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/pulsar-rebatch-proxy"]
