#!/usr/bin/env bash
# What the reach table (make bench-reach, workloads/reach) runs beyond scripts/test-deps.sh's
# programs, installed or built once and then reused:
#   - Debian's ruby, lua 5.4, perl, sqlite3, xz, gcc, postgresql 15;
#   - Lua 5.4 built statically with musl from Debian's own source package (the musl row): the
#     source is fetched with apt-get source through a sources list of this script's own (the
#     machine's deb lines as deb-src), leaving the machine's apt configuration alone.
# As root; prints nothing when all is in place.
set -euo pipefail

packages=(ruby lua5.4 perl sqlite3 xz-utils gcc musl-tools postgresql-15 postgresql-client-15 python3-numpy nodejs openjdk-17-jdk-headless redis-server memcached)
cache=${FARMEM_REACH_CACHE:-/var/cache/farmem-reach}
lua_musl=${FARMEM_REACH_LUA_MUSL:-$cache/lua5.4-musl}

[ "$(id -u)" = 0 ] || { echo "reach-deps.sh: run as root (apt-get)" >&2; exit 1; }
need=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "reach-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  # The packages start their services; the table starts its own instances.
  for s in postgresql redis-server memcached; do
    systemctl stop $s >/dev/null 2>&1 || service $s stop >/dev/null 2>&1 || true
  done
fi

if [ ! -x "$lua_musl" ]; then
  echo "reach-deps: building Lua 5.4 with musl from Debian's source into $lua_musl (once)" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp" # apt fetches as the user _apt
  mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/src"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    sed 's/^Types: deb$/Types: deb-src/' "$f" >"$tmp/parts/$(basename "$f")"
  done
  if [ -e /etc/apt/sources.list ]; then
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$tmp/parts/list.list"
  fi
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$tmp/parts" -o Dir::State::Lists="$tmp/lists")
  apt-get -qq "${apt_opts[@]}" update
  (cd "$tmp/src" && apt-get -qq "${apt_opts[@]}" source --download-only lua5.4 >/dev/null 2>&1)
  tar -C "$tmp/src" -xzf "$tmp"/src/lua5.4_*.orig.tar.gz
  src=$(echo "$tmp"/src/lua-5.4*/src)
  mkdir -p "$(dirname "$lua_musl")"
  # lua.c and the library, not luac.c (a second main); POSIX, without dlopen (static).
  musl-gcc -static -O2 -DLUA_USE_POSIX -o "$lua_musl.tmp" $(ls "$src"/*.c | grep -v '/luac\.c$') -lm
  mv "$lua_musl.tmp" "$lua_musl"
fi
