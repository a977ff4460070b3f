#!/usr/bin/env bash
# run.sh: start a real Apache Pulsar (the embedded default, from Maven Central), start the proxy
# in front of it with the demo's policy rules (e2e/demo/policies.yaml), run the same small
# workloads directly and through the proxy (e2e/demo) and print, side by side, what the broker
# stored and what consumers saw under each policy. The proxy then keeps running in the foreground
# until Ctrl-C, which stops it and the broker.
#
#   ./run.sh                    proxy on pulsar://127.0.0.1:6650, metrics on http://127.0.0.1:9650/metrics
#
# Settings (environment): PROXY_LISTEN [127.0.0.1:6650], PROXY_METRICS [127.0.0.1:9650],
# RUN_EXIT_AFTER_DEMO=1 to stop everything once the demo traffic has gone through, and the
# PULSAR_* settings of e2e/pulsar/pulsar.sh for the broker.
set -euo pipefail
SECONDS=0
cd "$(dirname "${BASH_SOURCE[0]}")"
PROXY_LISTEN=${PROXY_LISTEN:-127.0.0.1:6650}
PROXY_METRICS=${PROXY_METRICS:-127.0.0.1:9650}

e2e/pulsar/pulsar.sh start
eval "$(e2e/pulsar/pulsar.sh env | sed 's/^/export /')"

mkdir -p bin
echo "run.sh: building the proxy and the demo (one build; the first one on a machine takes a minute or two)"
go build -o bin/ ./cmd/proxy ./e2e/demo
mv bin/proxy bin/pulsar-rebatch-proxy
proxy_log=bin/pulsar-rebatch-proxy.log
bin/pulsar-rebatch-proxy --config e2e/demo/policies.yaml --listen "$PROXY_LISTEN" --broker-url "$PULSAR_SERVICE_URL" --metrics-listen "$PROXY_METRICS" 2>"$proxy_log" &
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
curl -fs "http://$PROXY_METRICS/readyz" >/dev/null || { echo "run.sh: the proxy did not become ready; its log, $proxy_log:" >&2; cat "$proxy_log" >&2; exit 1; }

echo "run.sh: proxy on pulsar://$PROXY_LISTEN in front of $PULSAR_SERVICE_URL (ready after $SECONDS s, logging to $proxy_log); running the workloads directly and through it"
bin/demo --proxy "pulsar://$PROXY_LISTEN" --broker "$PULSAR_SERVICE_URL" --admin "$PULSAR_ADMIN_URL"
echo "run.sh: the table above came $SECONDS s after ./run.sh started"
echo "run.sh: the proxy's own count (http://$PROXY_METRICS/metrics), entries it built by policy:"
curl -fs "http://$PROXY_METRICS/metrics" | grep -E '^rebatchproxy_rebatch_(entries|client_sends)_total' || true

if [ "${RUN_EXIT_AFTER_DEMO:-0}" = 1 ]; then exit 0; fi
echo "run.sh: proxy running; point clients at pulsar://$PROXY_LISTEN. Ctrl-C stops the proxy and the broker."
wait "$proxy_pid"
