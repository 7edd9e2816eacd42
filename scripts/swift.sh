#!/usr/bin/env bash
# `scripts/swift.sh ARGS...` runs `swift ARGS` inside the Swift toolchain root
# (scripts/swift-toolchain.sh creates it on first use), in the current directory, with the checkout
# mounted at its own absolute path (so #filePath, rpaths and error messages name real files).
#
# Every mount lives in a private mount namespace made for this one run (`unshare --mount`): when
# the run ends — success, failure, Ctrl-C or SIGKILL — the kernel drops the namespace and with it
# every mount, and two concurrent runs never see each other's mounts. Nothing is mounted on the
# host. Also mounted: $CARGO_TARGET_DIR when it lies outside the checkout, and each directory
# of $CC_SWIFT_MOUNTS (colon-separated). Environment passed in: CC_*, RUST_LOG, RUST_BACKTRACE.
set -euo pipefail

if [ "${1:-}" = "--inside-namespace" ]; then
    shift
    root=$1 cwd=$2; shift 2
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
    IFS=: read -r -a dirs <<<"$CC_SWIFT_BIND"
    for d in "${dirs[@]}"; do
        [ -n "$d" ] || continue
        mkdir -p "$root$d"
        mount --rbind "$d" "$root$d"
    done
    env_args=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
    while IFS= read -r name; do
        case "$name" in
            CC_SWIFT_BIND) ;;
            CC_*|RUST_LOG|RUST_BACKTRACE) env_args+=("$name=${!name}") ;;
        esac
    done < <(compgen -e)
    [ -n "${TERM:-}" ] && env_args+=("TERM=$TERM")
    exec chroot "$root" /usr/bin/env -i "${env_args[@]}" /bin/sh -c 'cd "$1" && shift && exec swift "$@"' sh "$cwd" "$@"
fi

die() { printf 'swift.sh: %s\n' "$*" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd -P)
[ "$(id -u)" = 0 ] || die "needs root (a mount namespace and chroot into the toolchain root); run as root or with sudo"
command -v unshare >/dev/null || die "needs unshare (util-linux)"
root=$(bash "$repo/scripts/swift-toolchain.sh")
cwd=$(pwd -P)

bind="$repo"
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    t=$(mkdir -p "$CARGO_TARGET_DIR" && cd "$CARGO_TARGET_DIR" && pwd -P)
    case "$t/" in "$repo"/*) ;; *) bind="$bind:$t" ;; esac
fi
[ -n "${CC_SWIFT_MOUNTS:-}" ] && bind="$bind:$CC_SWIFT_MOUNTS"
case "$cwd/" in
    "$repo"/*) ;;
    *) inside=0
       IFS=: read -r -a dirs <<<"$bind"
       for d in "${dirs[@]}"; do case "$cwd/" in "$d"/*) inside=1 ;; esac; done
       [ "$inside" = 1 ] || die "the current directory $cwd is not under the checkout $repo nor a mounted directory (add it to CC_SWIFT_MOUNTS)" ;;
esac

export CC_SWIFT_BIND="$bind"
exec unshare --mount --propagation private -- bash "$repo/scripts/swift.sh" --inside-namespace "$root" "$cwd" "$@"
