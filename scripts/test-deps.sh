#!/usr/bin/env bash
# What `make test` needs beyond Go and gcc, installed or built once and then reused:
#   - the programs the end-to-end tests run (Debian packages: redis, memcached, numpy, a JDK, node, ...);
#   - Jaeger v2, the real OTLP receiver of the telemetry test (cmd/farmem/jaeger_test.go),
#     built from its Go module into a cache outside the repository ($FARMEM_JAEGER).
# The tests run as root (userfaultfd, /proc of other processes, memory cgroups), so this does
# too; it says what is missing and fails otherwise. It prints nothing when all is in place.
set -euo pipefail

packages=(gcc make libc6-dev musl-tools redis-server redis-tools memcached bc jq iproute2 openssl python3 python3-numpy
  openjdk-17-jdk-headless nodejs)
jaeger_version=v1.76.0
jaeger=${FARMEM_JAEGER:-/var/cache/farmem-jaeger/jaeger-$jaeger_version}

need=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ "$(id -u)" != 0 ]; then
  echo "make test runs as root (userfaultfd, /proc of other processes, memory cgroups)" >&2
  [ ${#need[@]} -eq 0 ] || echo "and it needs these Debian packages: ${need[*]}" >&2
  exit 1
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "test-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  # The packages start their services; the tests start their own instances.
  systemctl stop redis-server memcached >/dev/null 2>&1 || true
  service redis-server stop >/dev/null 2>&1 || true
  service memcached stop >/dev/null 2>&1 || true
fi

if [ ! -x "$jaeger" ]; then
  echo "test-deps: building Jaeger $jaeger_version into $jaeger (once; a few minutes)" >&2
  mkdir -p "$(dirname "$jaeger")"
  dir=$(cd / && go mod download -json "github.com/jaegertracing/jaeger@$jaeger_version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -n "$dir" ] || { echo "test-deps: could not download the Jaeger module" >&2; exit 1; }
  (cd "$dir" && GOFLAGS=-mod=mod go build -o "$jaeger.tmp" ./cmd/jaeger)
  mv "$jaeger.tmp" "$jaeger"
fi
