#!/usr/bin/env bash
# setup.sh: prepare every e2e client driver (build the pulsar-client-go drivers, download the Java
# client jars and compile the Java driver, create the Python venvs, build the pulsar-rs driver
# with cargo) into e2e/drivers/.cache/.
# A second run finds everything cached and downloads nothing. Meant to be called once by .ci/run.
#
#   e2e/drivers/setup.sh              every driver
#   e2e/drivers/setup.sh go-v0.8.1    only the named ones
#
# A missing tool is named and the script exits 2; a failed download or build exits 1.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
for tool in go java javac mvn python3 cargo protoc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup.sh: missing tool '$tool' on PATH" >&2; exit 2; }
done
cd "$repo"
exec go run ./e2e/drivers/cmd/prepare-drivers "$@"
