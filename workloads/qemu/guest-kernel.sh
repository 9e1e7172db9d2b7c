# guest-kernel.sh: sourced by the scripts that test farmem in a qemu guest (workloads/rdma,
# workloads/cgroup2). They need the same two things: host packages, and Debian's kernel with a
# few of its modules, fetched once into a cache. The caller defines say and die.

# need_packages PKG...: installs the Debian packages that are missing (as root; otherwise says
# which and fails).
need_packages() {
  local p need=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  say "installing ${need[*]}"
  [ "$(id -u)" = 0 ] || die "missing packages ${need[*]} (run as root, or apt-get install them)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# guest_kernel CACHE PKG MODULE...: puts the kernel of linux-image package PKG (empty: the one
# linux-image-amd64 names) in CACHE/vmlinuz, and each MODULE with the modules it depends on in
# CACHE/mods, their names in load order in CACHE/mods/order. A module the package does not ship
# is built into its kernel: nothing to load. Does nothing if CACHE already holds them.
guest_kernel() {
  local cache=$1 pkg=$2
  shift 2
  [ -s "$cache/vmlinuz" ] && [ -s "$cache/mods/order" ] && return 0
  kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
  [ -n "$pkg" ] || pkg=$(kernel_pkg)
  if [ -z "$pkg" ] && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && pkg=$(kernel_pkg) # a fresh machine may have no package lists yet
  fi
  [ -n "$pkg" ] || die "apt-cache names no kernel for linux-image-amd64 (apt-get update?)"
  say "fetching $pkg"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1) || { rm -rf "$tmp"; die "apt-get download $pkg"; }
  dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*' './lib/modules/*/kernel/*'
  local kdir
  kdir=$(echo "$tmp"/lib/modules/*/kernel)
  rm -rf "$cache" && mkdir -p "$cache/mods"
  local -A seen=()
  resolve() {
    local m=$1 f d x
    [ -n "${seen[$m]:-}" ] && return 0
    seen[$m]=1
    f=$(find "$kdir" \( -name "$m.ko" -o -name "${m//_/-}.ko" \) | head -1)
    [ -n "$f" ] || return 0 # built in
    d=$(modinfo -F depends "$f")
    for x in ${d//,/ }; do resolve "$x"; done
    cp "$f" "$cache/mods/$m.ko"
    echo "$m" >> "$cache/mods/order"
  }
  local m
  for m in "$@"; do resolve "$m"; done
  touch "$cache/mods/order"
  cp "$tmp"/boot/vmlinuz-* "$cache/vmlinuz"
  echo "$pkg" > "$cache/kernel"
  rm -rf "$tmp"
}
