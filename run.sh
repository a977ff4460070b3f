#!/usr/bin/env bash
# run.sh: start a real Apache Pulsar (the embedded default, from Maven Central), start the proxy
# in front of it, and send traffic through the proxy to show it working. The proxy then keeps
# running in the foreground until Ctrl-C, which stops it and the broker.
#
#   ./run.sh                    proxy on pulsar://127.0.0.1:6650, metrics on http://127.0.0.1:9650/metrics
#
# Settings (environment): PROXY_LISTEN [127.0.0.1:6650], PROXY_METRICS [127.0.0.1:9650],
# RUN_EXIT_AFTER_DEMO=1 to stop everything once the demo traffic has gone through, and the
# PULSAR_* settings of e2e/pulsar/pulsar.sh for the broker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
PROXY_LISTEN=${PROXY_LISTEN:-127.0.0.1:6650}
PROXY_METRICS=${PROXY_METRICS:-127.0.0.1:9650}

e2e/pulsar/pulsar.sh start
eval "$(e2e/pulsar/pulsar.sh env | sed 's/^/export /')"

mkdir -p bin
go build -o bin/pulsar-rebatch-proxy ./cmd/proxy
bin/pulsar-rebatch-proxy --listen "$PROXY_LISTEN" --broker-url "$PULSAR_SERVICE_URL" --metrics-listen "$PROXY_METRICS" &
proxy_pid=$!
cleanup() {
  kill -TERM "$proxy_pid" 2>/dev/null || true
  wait "$proxy_pid" 2>/dev/null || true
  e2e/pulsar/pulsar.sh stop
}
trap cleanup EXIT
for _ in $(seq 1 50); do
  curl -fs "http://$PROXY_METRICS/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fs "http://$PROXY_METRICS/readyz" >/dev/null || { echo "run.sh: the proxy did not become ready" >&2; exit 1; }

echo "run.sh: proxy on pulsar://$PROXY_LISTEN in front of $PULSAR_SERVICE_URL; sending demo traffic through it"
go run ./e2e/demo --proxy "pulsar://$PROXY_LISTEN" --admin "$PULSAR_ADMIN_URL"
echo "run.sh: proxy frames by command (from http://$PROXY_METRICS/metrics):"
curl -fs "http://$PROXY_METRICS/metrics" | grep -E '^rebatchproxy_frames_total' | head -n 12 || true

if [ "${RUN_EXIT_AFTER_DEMO:-0}" = 1 ]; then exit 0; fi
echo "run.sh: proxy running; point clients at pulsar://$PROXY_LISTEN. Ctrl-C stops the proxy and the broker."
wait "$proxy_pid"
