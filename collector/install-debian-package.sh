#!/usr/bin/env bash
# Install a Debian package for a program the tests run themselves, if the program is not already
# on PATH:   collector/install-debian-package.sh PACKAGE PROGRAM
# Idempotent. Prints the absolute path of PROGRAM as the LAST line of stdout; progress goes to
# stderr. Used by install-prometheus.sh and install-etcd.sh.
#
# The tests run these programs themselves (own config, own ports), so the Debian service is never
# wanted: a policy-rc.d forbids service starts during the install, and on machines without
# systemd (containers, CI) a failing postinst is tolerated as long as the binary works.
set -euo pipefail
exec 3>&1 1>&2

[[ $# == 2 ]] || { echo "usage: $0 PACKAGE PROGRAM" >&2; exit 2; }
PACKAGE="$1"
PROGRAM="$2"

log() { printf '[install-%s] %s\n' "$PROGRAM" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

find_program() {
  command -v "$PROGRAM" 2>/dev/null && return 0
  [[ -x "/usr/bin/$PROGRAM" ]] && { echo "/usr/bin/$PROGRAM"; return 0; }
  return 1
}

finish() {
  local bin="$1"
  "$bin" --version >&2 || die "'$bin --version' failed"
  printf '%s\n' "$bin" >&3
  exit 0
}

if bin="$(find_program)"; then
  log "already installed: $bin"
  finish "$bin"
fi

command -v apt-get >/dev/null || die "$PROGRAM not on PATH and apt-get not available"
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $PACKAGE"
  SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive

# Forbid service (re)starts from maintainer scripts for the duration of the install
# (invoke-rc.d / deb-systemd-invoke honour /usr/sbin/policy-rc.d exit code 101).
POLICY=/usr/sbin/policy-rc.d
POLICY_CREATED=0
if [[ ! -e "$POLICY" ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
  POLICY_CREATED=1
fi
cleanup() { if [[ "$POLICY_CREATED" == 1 ]]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

apt_install() {
  $SUDO apt-get install -y --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$PACKAGE"
}

# Only refresh the package lists when the package is unknown or the install fails.
if ! apt-cache show "$PACKAGE" >/dev/null 2>&1 || ! apt-cache policy "$PACKAGE" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  log "apt-get update (package lists missing/stale)"
  $SUDO apt-get update -q
fi

if ! apt_install; then
  log "apt-get install failed; retrying after apt-get update"
  $SUDO apt-get update -q || true
  if ! apt_install; then
    # Without systemd the postinst can fail; the files are unpacked all the same.
    log "install reported an error (typically the service start on a host without systemd);" \
        "checking whether the binary is usable anyway"
    $SUDO dpkg --configure -a || true
  fi
fi

bin="$(find_program)" || die "$PROGRAM binary not found after install"
log "installed: $bin"
finish "$bin"
