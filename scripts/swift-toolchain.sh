#!/usr/bin/env bash
# Creates (once, then reuses) a Debian trixie root holding Swift 6 (`swiftlang`), outside the
# checkout: $CC_SWIFT_ROOT, default ~/.cache/cc-app-server/swift-trixie. Prints the root's path.
# Needs root (debootstrap, chroot, mounts) and a readable Debian mirror: the one this machine's
# apt already uses (or $CC_SWIFT_MIRROR). docs/swift.md explains the why and the how.
#
# Safe to run concurrently and after an interrupted run: the root is built in a private
# directory next to the target and renamed into place only once `swift --version` works in it,
# under an exclusive lock.
set -euo pipefail

ROOT="${CC_SWIFT_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/cc-app-server/swift-trixie}"
SUITE="${CC_SWIFT_SUITE:-trixie}"
PACKAGES="swiftlang"

die() { printf 'swift-toolchain: %s\n' "$*" >&2; exit 1; }
log() { printf 'swift-toolchain: %s\n' "$*" >&2; }

# `usr/bin/swift` is an absolute symlink inside the root: test the link, not what it names here.
ready() { { [ -L "$1/usr/bin/swift" ] || [ -x "$1/usr/bin/swift" ]; } && [ -f "$1/.cc-swift-ready" ]; }

if ready "$ROOT"; then
    printf '%s\n' "$ROOT"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts); run it as root or with sudo (CI runs as root)"

# The mirror: this machine's own apt source, so no other host has to be reachable.
mirror() {
    if [ -n "${CC_SWIFT_MIRROR:-}" ]; then printf '%s\n' "$CC_SWIFT_MIRROR"; return; fi
    local m=""
    if [ -d /etc/apt/sources.list.d ]; then
        m=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' \
            /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    fi
    if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
        m=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:.*\/debian\/?$/) { print $i; exit } }' \
            /etc/apt/sources.list || true)
    fi
    printf '%s\n' "${m:-http://deb.debian.org/debian}"
}
MIRROR="$(mirror)"

mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
if ready "$ROOT"; then printf '%s\n' "$ROOT"; exit 0; fi

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >&2 \
        || die "could not install debootstrap with apt-get"
fi

# The mirror must serve the suite before we spend minutes on it.
if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time 30 -o /dev/null "$MIRROR/dists/$SUITE/Release" \
        || die "cannot read $MIRROR/dists/$SUITE/Release: the mirror is unreachable or has no $SUITE (set CC_SWIFT_MIRROR)"
fi

WORK="$ROOT.building.$$"
cleanup() {
    # Undo whatever this run mounted inside the unfinished root, then drop it.
    for m in "$WORK/dev" "$WORK/proc"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true; done
    rm -rf --one-file-system "$WORK" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$(date +%s)
log "debootstrap $SUITE from $MIRROR into $WORK"
debootstrap --variant=minbase "$SUITE" "$WORK" "$MIRROR" >"$WORK.log" 2>&1 \
    || { tail -n 20 "$WORK.log" >&2; rm -f "$WORK.log"; die "debootstrap failed (log above)"; }
rm -f "$WORK.log"
cp /etc/resolv.conf "$WORK/etc/resolv.conf" 2>/dev/null || true
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$WORK/etc/apt/sources.list"

log "apt-get install $PACKAGES inside the root"
unshare --mount --propagation private -- sh -ec '
    mount -t proc proc "$1/proc"
    mount --rbind /dev "$1/dev"
    chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -ec "apt-get update -qq && apt-get install -y -qq $2 libc6-dev >/dev/null && apt-get clean"
    chroot "$1" /usr/bin/swift --version
' sh "$WORK" "$PACKAGES" >&2 || die "installing $PACKAGES in the trixie root failed"

date -u +%FT%TZ >"$WORK/.cc-swift-ready"
rm -rf --one-file-system "$ROOT"
mv "$WORK" "$ROOT"
trap - EXIT
log "ready in $(( $(date +%s) - t0 )) s: $ROOT"
printf '%s\n' "$ROOT"
