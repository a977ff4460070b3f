#!/usr/bin/env bash
# Regenerates pulsar_api.pb.go from pulsar_api.proto.
#
# Run through `go generate ./wire/...` (see gen.go). It needs Go and either
# Maven (preferred) or curl, and caches tools under wire/.cache/ (git-ignored):
#   - protoc: the official build published on Maven Central as
#     com.google.protobuf:protoc:${PROTOC_VERSION}:exe:linux-x86_64, checked
#     against a pinned SHA-256 so a changed artifact fails loudly;
#   - protoc-gen-go: built from the google.golang.org/protobuf version pinned
#     in go.mod, so generator and runtime always match.
set -euo pipefail

PROTOC_VERSION=4.33.5 # Maven version; the binary reports libprotoc 33.5
PROTOC_SHA256=e8d496f7dacade5bf42a11f4fbeb61e9bdfddd494fd292f5f1881ddc169e69cf

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="$here/../.cache/protoc"
mkdir -p "$cache"

case "$(uname -s)-$(uname -m)" in
Linux-x86_64) ;;
*)
	echo "gen.sh: only linux-x86_64 is wired up (pinned checksum); add a classifier and checksum for $(uname -s)-$(uname -m)" >&2
	exit 1
	;;
esac

protoc="$cache/protoc-$PROTOC_VERSION"
if [[ ! -x "$protoc" ]]; then
	tmp="$(mktemp -d)"
	trap 'rm -rf "$tmp"' EXIT
	artifact="com.google.protobuf:protoc:$PROTOC_VERSION:exe:linux-x86_64"
	if command -v mvn >/dev/null; then
		mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$tmp" >&2
	else
		curl -fsSL -o "$tmp/protoc-$PROTOC_VERSION-linux-x86_64.exe" \
			"https://repo1.maven.org/maven2/com/google/protobuf/protoc/$PROTOC_VERSION/protoc-$PROTOC_VERSION-linux-x86_64.exe"
	fi
	got="$(sha256sum "$tmp/protoc-$PROTOC_VERSION-linux-x86_64.exe" | cut -d' ' -f1)"
	if [[ "$got" != "$PROTOC_SHA256" ]]; then
		echo "gen.sh: protoc checksum mismatch: got $got, want $PROTOC_SHA256" >&2
		exit 1
	fi
	install -m 0755 "$tmp/protoc-$PROTOC_VERSION-linux-x86_64.exe" "$protoc"
fi

# Build the generator at the version go.mod pins.
(cd "$here" && go build -o "$cache/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go)

# Compile from the repository root so the file registers as
# wire/pulsarpb/pulsar_api.proto, a path no other linked module uses.
cd "$here/../.."
"$protoc" --plugin=protoc-gen-go="$cache/protoc-gen-go" \
	--proto_path=. \
	--go_out=. --go_opt=paths=source_relative \
	wire/pulsarpb/pulsar_api.proto
echo "gen.sh: regenerated $(ls "$here"/*.pb.go) with libprotoc $("$protoc" --version | cut -d' ' -f2)" >&2
