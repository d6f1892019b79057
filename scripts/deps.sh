#!/usr/bin/env bash
# Installs what building and testing Loom needs, if it is missing (Debian/Ubuntu).
set -euo pipefail
# install [apt-get options] -- packages: those not installed yet, in one apt-get call.
install() {
  local opts=() need=() pkg
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  [ ${#need[@]} -gt 0 ] || return 0
  local SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "loom: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ${opts[@]+"${opts[@]}"} \
    "${need[@]}" >/dev/null
}
install -- cmake ninja-build g++ make libgtest-dev libbenchmark-dev python3 iproute2 binutils libucx-dev \
  libibverbs-dev
# The rxe VM (scripts/rxe_vm.sh, CTest label rxe): QEMU, a static busybox, rdma-core's
# user space and perftest; installed here so that no test runs apt-get.
install --no-install-recommends -- qemu-system-x86 busybox-static ibverbs-utils \
  ibverbs-providers perftest kmod cpio
