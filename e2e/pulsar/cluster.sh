#!/usr/bin/env bash
# The ports are assigned by sourcing $run/ports; the exports in subshells are meant to be local.
# shellcheck disable=SC2154,SC2030,SC2031
# cluster.sh: a real Pulsar cluster on loopback from the same distribution pulsar.sh fetches:
# one ZooKeeper (the metadata and configuration store), one bookie and PULSAR_CLUSTER_BROKERS
# brokers sharing them, under one cluster name. For tests of several proxies in front of several
# brokers (topic ownership spread over brokers, unloads between them).
#
#   e2e/pulsar/cluster.sh start     fetch if needed, start a fresh cluster, wait until every broker is ready
#   e2e/pulsar/cluster.sh stop      stop every process (brokers first) and wipe the data
#   e2e/pulsar/cluster.sh env       print the cluster's URLs as shell assignments
#   e2e/pulsar/cluster.sh worker    start a functions worker apart from the brokers (which run
#                                   none) for the running cluster, and wait until it serves
#   e2e/pulsar/cluster.sh stop-worker  stop that worker (the cluster keeps running)
#
# Settings (environment; defaults in brackets):
#   PULSAR_VERSION           server distribution version [4.0.8]
#   PULSAR_CACHE_DIR         as for pulsar.sh [<repo>/.pulsar]
#   PULSAR_INSTANCE          name of this cluster; its config, data, logs and pids live under
#                            $PULSAR_CACHE_DIR/run/$PULSAR_INSTANCE [cluster]
#   PULSAR_CLUSTER_BROKERS   number of brokers [2]
#   PULSAR_DEDUP             broker-wide de-duplication, true|false [false]
#   PULSAR_MAX_MESSAGE_SIZE  broker maxMessageSize in bytes [5242880]
#   PULSAR_READY_TIMEOUT     seconds to wait for each step [240]
#   JAVA_HOME                JDK used [the java on PATH]
#
# Ports are picked free at start and kept in $run/ports. Memory, sized for 2-core, 24 GiB
# machines: ZooKeeper 256 MiB heap, the bookie 512 MiB, each broker 512 MiB (plus direct memory).
# env prints PULSAR_SERVICE_URL and PULSAR_ADMIN_URL (the first broker), PULSAR_BROKER_URLS and
# PULSAR_ADMIN_URLS (every broker, comma-separated) and PULSAR_CLUSTER_NAME, and
# PULSAR_FUNCTIONS_WORKER_URL once `worker` has run (its heap: 256 MiB; functions run as threads
# inside it, not as processes).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

PULSAR_VERSION=${PULSAR_VERSION:-4.0.8}
PULSAR_CACHE_DIR=${PULSAR_CACHE_DIR:-$repo/.pulsar}
PULSAR_INSTANCE=${PULSAR_INSTANCE:-cluster}
PULSAR_CLUSTER_BROKERS=${PULSAR_CLUSTER_BROKERS:-2}
PULSAR_DEDUP=${PULSAR_DEDUP:-false}
PULSAR_MAX_MESSAGE_SIZE=${PULSAR_MAX_MESSAGE_SIZE:-5242880}
PULSAR_READY_TIMEOUT=${PULSAR_READY_TIMEOUT:-240}
export PULSAR_VERSION PULSAR_CACHE_DIR

dist="$PULSAR_CACHE_DIR/dist/apache-pulsar-$PULSAR_VERSION"
run="$PULSAR_CACHE_DIR/run/$PULSAR_INSTANCE"
cluster=rebatch-e2e

die() { echo "cluster.sh: $*" >&2; exit 2; }
log() { echo "cluster.sh: $*" >&2; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

java_home() {
  if [ -n "${JAVA_HOME:-}" ]; then echo "$JAVA_HOME"; return; fi
  local j; j=$(command -v java) || die "missing prerequisite: java (JDK 17+) is not on PATH and JAVA_HOME is unset"
  dirname "$(dirname "$(readlink -f "$j")")"
}

# spawn NAME HEAP CMD...: runs bin/pulsar CMD in its own session, logs and pid under $run.
spawn() {
  local name=$1 heap=$2; shift 2
  (
    JAVA_HOME=$(java_home); export JAVA_HOME
    export PULSAR_MEM="-Xms128m -Xmx$heap -XX:MaxDirectMemorySize=512m"
    export PULSAR_GC="-XX:+UseG1GC -XX:ParallelGCThreads=2 -XX:ConcGCThreads=1"
    export PULSAR_GC_LOG=" "
    export PULSAR_LOG_DIR="$run/logs/$name"
    export PULSAR_LOG_ROOT_LEVEL=info PULSAR_LOG_LEVEL=info
    exec setsid "$dist/bin/pulsar" "$@" >"$run/logs/$name.out" 2>&1
  ) &
  echo $! >"$run/$name.pid"
}

alive() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

# on_timeout is what wait_for runs when a wait times out: the whole cluster stops, unless the
# step started something on its own (a functions worker) that alone should.
on_timeout=cmd_stop

# wait_for NAME WHAT CHECK...: waits until CHECK succeeds, failing if NAME's process died.
wait_for() {
  local name=$1 what=$2; shift 2
  local deadline=$((SECONDS + PULSAR_READY_TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      tail -n 30 "$run/logs/$name.out" >&2 || true
      die "$name exited before $what; log: $run/logs/$name.out"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -n 30 "$run/logs/$name.out" >&2 || true
      $on_timeout
      die "$name: not $what within $PULSAR_READY_TIMEOUT s; log: $run/logs/$name.out"
    fi
    sleep 0.5
  done
}

# configure SRC DEST: copies a config file, replacing every key given on stdin (key=value lines):
# BookKeeper's configuration keeps the first of repeated keys, so appending is not enough.
configure() {
  local src=$1 dest=$2 over; over=$(cat)
  python3 - "$src" "$dest" "$over" <<'PY'
import sys
src, dest, over = sys.argv[1], sys.argv[2], sys.argv[3]
keys = {l.split("=", 1)[0].strip() for l in over.splitlines() if "=" in l and not l.startswith("#")}
with open(src) as f:
    kept = [l for l in f if l.split("=", 1)[0].strip() not in keys]
with open(dest, "w") as f:
    f.writelines(kept)
    f.write("\n### e2e overrides (e2e/pulsar/cluster.sh)\n" + over + "\n")
PY
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

broker_ready() {
  local web=$1
  [ "$(curl -fsS --max-time 5 "$web/admin/v2/brokers/health")" = ok ] &&
    curl -fsS --max-time 5 "$web/admin/v2/namespaces/public" | grep -q '"public/default"'
}

all_brokers_listed() {
  local n
  n=$(curl -fsS --max-time 5 "http://127.0.0.1:$web1/admin/v2/brokers/$cluster" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  [ "$n" -ge "$PULSAR_CLUSTER_BROKERS" ]
}

cmd_start() {
  command -v curl >/dev/null || die "missing prerequisite: curl"
  command -v python3 >/dev/null || die "missing prerequisite: python3"
  [[ "$PULSAR_CLUSTER_BROKERS" =~ ^[1-9]$ ]] || die "PULSAR_CLUSTER_BROKERS must be 1..9, not '$PULSAR_CLUSTER_BROKERS'"
  if [ -d "$run" ]; then cmd_stop; fi
  "$here/pulsar.sh" fetch
  rm -rf "$run"; mkdir -p "$run/conf" "$run/data" "$run/logs"
  local t0=$SECONDS
  local zk; zk=$(free_port)
  {
    echo "zk=$zk"
    echo "bookie=$(free_port)"
    for i in $(seq 1 "$PULSAR_CLUSTER_BROKERS"); do echo "broker$i=$(free_port)"; echo "web$i=$(free_port)"; done
  } >"$run/ports"
  # shellcheck disable=SC1091
  . "$run/ports"
  local store="zk:127.0.0.1:$zk"

  configure "$dist/conf/zookeeper.conf" "$run/conf/zookeeper.conf" <<EOF
dataDir=$run/data/zookeeper
clientPort=$zk
clientPortAddress=127.0.0.1
admin.enableServer=false
metricsProvider.httpHost=127.0.0.1
metricsProvider.httpPort=$(free_port)
EOF
  PULSAR_ZK_CONF="$run/conf/zookeeper.conf" spawn zookeeper 256m zookeeper
  wait_for zookeeper "listening on $zk" port_open "$zk"

  (
    JAVA_HOME=$(java_home); export JAVA_HOME
    export PULSAR_LOG_DIR="$run/logs/init" PULSAR_MEM="-Xmx256m"
    "$dist/bin/pulsar" initialize-cluster-metadata --cluster "$cluster" \
      --metadata-store "$store" --configuration-metadata-store "$store" \
      --web-service-url "http://127.0.0.1:$web1" --broker-service-url "pulsar://127.0.0.1:$broker1" \
      >"$run/logs/init.out" 2>&1
  ) || { tail -n 30 "$run/logs/init.out" >&2; cmd_stop; die "initialize-cluster-metadata failed; log: $run/logs/init.out"; }

  configure "$dist/conf/bookkeeper.conf" "$run/conf/bookkeeper.conf" <<EOF
bookiePort=$bookie
allowLoopback=true
advertisedAddress=127.0.0.1
metadataServiceUri=zk+hierarchical://127.0.0.1:$zk/ledgers
zkServers=127.0.0.1:$zk
journalDirectory=$run/data/bookie/journal
ledgerDirectories=$run/data/bookie/ledgers
httpServerEnabled=false
prometheusStatsHttpAddress=127.0.0.1
prometheusStatsHttpPort=$(free_port)
dbStorage_writeCacheMaxSizeMb=32
dbStorage_readAheadCacheMaxSizeMb=32
dbStorage_rocksDB_blockCacheSize=16777216
journalSyncData=false
EOF
  PULSAR_BOOKKEEPER_CONF="$run/conf/bookkeeper.conf" spawn bookie 512m bookie
  wait_for bookie "listening on $bookie" port_open "$bookie"

  for i in $(seq 1 "$PULSAR_CLUSTER_BROKERS"); do
    local bp wp; bp=$(eval echo "\$broker$i"); wp=$(eval echo "\$web$i")
    configure "$dist/conf/broker.conf" "$run/conf/broker$i.conf" <<EOF
metadataStoreUrl=$store
configurationMetadataStoreUrl=$store
clusterName=$cluster
bindAddress=127.0.0.1
advertisedAddress=127.0.0.1
brokerServicePort=$bp
webServicePort=$wp
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
brokerDeduplicationEnabled=$PULSAR_DEDUP
maxMessageSize=$PULSAR_MAX_MESSAGE_SIZE
nettyMaxFrameSizeBytes=$((PULSAR_MAX_MESSAGE_SIZE + 10240))
functionsWorkerEnabled=false
webSocketServiceEnabled=false
managedLedgerCacheSizeMB=64
numIOThreads=2
numHttpServerThreads=8
exposingBrokerEntryMetadataToClientEnabled=false
EOF
    PULSAR_BROKER_CONF="$run/conf/broker$i.conf" spawn "broker$i" 512m broker
  done
  for i in $(seq 1 "$PULSAR_CLUSTER_BROKERS"); do
    wait_for "broker$i" "ready" broker_ready "http://127.0.0.1:$(eval echo "\$web$i")"
  done
  wait_for broker1 "seeing all $PULSAR_CLUSTER_BROKERS brokers" all_brokers_listed
  log "Apache Pulsar $PULSAR_VERSION cluster '$cluster' ready in $((SECONDS - t0)) s: ZooKeeper 127.0.0.1:$zk, bookie 127.0.0.1:$bookie, $PULSAR_CLUSTER_BROKERS brokers ($(cmd_env | grep PULSAR_BROKER_URLS | cut -d= -f2)), instance $PULSAR_INSTANCE, dedup=$PULSAR_DEDUP"
}

# configure_yaml SRC DEST: copies a YAML config file, replacing the top-level keys given on stdin
# ("key: value" lines, a key's nested lines indented under it).
configure_yaml() {
  local src=$1 dest=$2 over; over=$(cat)
  python3 - "$src" "$dest" "$over" <<'PY'
import sys
src, dest, over = sys.argv[1], sys.argv[2], sys.argv[3]
keys = {l.split(":", 1)[0] for l in over.splitlines() if ":" in l and l[:1] not in (" ", "#")}
kept, skipping = [], False
with open(src) as f:
    for l in f:
        if l[:1] not in (" ", "\t", "#", "-", "\n") and ":" in l:
            skipping = l.split(":", 1)[0] in keys
        elif l[:1] not in (" ", "\t", "-"):
            skipping = False
        if not skipping:
            kept.append(l)
with open(dest, "w") as f:
    f.writelines(kept)
    f.write("\n### e2e overrides (e2e/pulsar/cluster.sh)\n" + over + "\n")
PY
}

worker_ready() { curl -fsS --max-time 5 "http://127.0.0.1:$1/admin/v2/worker/cluster" | grep -q workerId; }

cmd_worker() {
  [ -f "$run/ports" ] || die "cluster instance '$PULSAR_INSTANCE' was not started"
  # shellcheck disable=SC1091
  . "$run/ports"
  alive broker1 || die "cluster instance '$PULSAR_INSTANCE' has no running broker"
  if alive worker; then log "functions worker already running on port $worker"; return; fi
  local port; port=$(free_port)
  sed -i '/^worker=/d' "$run/ports"; echo "worker=$port" >>"$run/ports"
  mkdir -p "$run/data/worker"
  configure_yaml "$dist/conf/functions_worker.yml" "$run/conf/functions_worker.yml" <<EOF
workerId: e2e-worker-$port
workerHostname: 127.0.0.1
workerPort: $port
workerPortTls: null
configurationMetadataStoreUrl: zk:127.0.0.1:$zk
pulsarServiceUrl: pulsar://127.0.0.1:$broker1
pulsarWebServiceUrl: http://127.0.0.1:$web1
pulsarFunctionsCluster: $cluster
downloadDirectory: $run/data/worker/download
numFunctionPackageReplicas: 1
numHttpServerThreads: 4
functionRuntimeFactoryClassName: org.apache.pulsar.functions.runtime.thread.ThreadRuntimeFactory
functionRuntimeFactoryConfigs:
  threadGroupName: e2e-functions
EOF
  local t0=$SECONDS
  PULSAR_WORKER_CONF="$run/conf/functions_worker.yml" spawn worker 256m functions-worker
  on_timeout="stop_one worker"
  wait_for worker "serving on $port" worker_ready "$port"
  log "functions worker ready in $((SECONDS - t0)) s: http://127.0.0.1:$port (cluster '$cluster')"
}

stop_one() {
  local name=$1 pid
  [ -f "$run/$name.pid" ] || return 0
  pid=$(cat "$run/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$run/$name.pid"
}

cmd_stop() {
  [ -d "$run" ] || return 0
  stop_one worker
  for f in "$run"/broker*.pid; do [ -e "$f" ] && stop_one "$(basename "$f" .pid)"; done
  stop_one bookie
  stop_one zookeeper
  rm -rf "$run/data"
  log "stopped cluster instance '$PULSAR_INSTANCE'"
}

cmd_env() {
  [ -f "$run/ports" ] || die "cluster instance '$PULSAR_INSTANCE' was not started"
  # shellcheck disable=SC1091
  . "$run/ports"
  local urls="" webs=""
  for i in $(seq 1 "$PULSAR_CLUSTER_BROKERS"); do
    urls="$urls${urls:+,}pulsar://127.0.0.1:$(eval echo "\$broker$i")"
    webs="$webs${webs:+,}http://127.0.0.1:$(eval echo "\$web$i")"
  done
  echo "PULSAR_SERVICE_URL=pulsar://127.0.0.1:$broker1"
  echo "PULSAR_ADMIN_URL=http://127.0.0.1:$web1"
  echo "PULSAR_BROKER_URLS=$urls"
  echo "PULSAR_ADMIN_URLS=$webs"
  echo "PULSAR_CLUSTER_NAME=$cluster"
  echo "PULSAR_HOME=$dist"
  if [ -n "${worker:-}" ]; then echo "PULSAR_FUNCTIONS_WORKER_URL=http://127.0.0.1:$worker"; fi
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  env) cmd_env ;;
  worker) cmd_worker ;;
  stop-worker) stop_one worker; sed -i '/^worker=/d' "$run/ports" 2>/dev/null || true ;;
  *) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
