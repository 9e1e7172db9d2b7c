#!/usr/bin/env bash
# What `make test` needs beyond Go and gcc, installed or built once and then reused:
#   - the programs the end-to-end tests run (Debian packages: redis, memcached, numpy, a JDK, node, ...);
#   - Jaeger v2, the real OTLP receiver of the telemetry test (cmd/farmem/jaeger_test.go),
#     built from its Go module into a cache outside the repository ($FARMEM_JAEGER);
#   - etcd, the ctrl's replicated store in the ctrl's tests (ctrl/etcdtest), built the same way
#     from workloads/etcd, a main package of ours that pins the server module ($FARMEM_ETCD).
# The tests run as root (userfaultfd, /proc of other processes, memory cgroups), so this does
# too; it says what is missing and fails otherwise. It prints nothing when all is in place.
set -euo pipefail

packages=(gcc make libc6-dev musl-tools redis-server redis-tools memcached bc jq iproute2 openssl curl python3 python3-numpy
  openjdk-17-jdk-headless nodejs sqlite3)
jaeger_version=v1.76.0
jaeger=${FARMEM_JAEGER:-/var/cache/farmem-jaeger/jaeger-$jaeger_version}
etcd_version=v3.7.3 # workloads/etcd/go.mod's server, go.mod's client and ctrl/etcdtest say the same
etcd=${FARMEM_ETCD:-/var/cache/farmem-etcd/etcd-$etcd_version}

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

if [ ! -x "$etcd" ]; then
  echo "test-deps: building etcd $etcd_version into $etcd (once; about a minute)" >&2
  mkdir -p "$(dirname "$etcd")"
  # The server module's own directory does not build (its go.mod replaces modules by relative
  # path); our two-line main package in its own module does.
  (cd "$(dirname "$0")/../workloads/etcd" && go build -o "$etcd.tmp" .)
  mv "$etcd.tmp" "$etcd"
fi
