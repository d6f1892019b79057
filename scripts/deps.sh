#!/usr/bin/env bash
# Installs what building and testing Loom needs, if it is missing (Debian/Ubuntu).
set -euo pipefail
need=()
for pkg in cmake g++ make libgtest-dev libbenchmark-dev python3 iproute2 binutils libucx-dev libibverbs-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "loom: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The rxe VM (scripts/rxe_vm.sh, CTest label rxe): QEMU, a static busybox, rdma-core's
# user space and perftest; installed here so that no test runs apt-get.
vm=()
for pkg in qemu-system-x86 busybox-static ibverbs-utils ibverbs-providers perftest kmod cpio; do
  dpkg -s "$pkg" >/dev/null 2>&1 || vm+=("$pkg")
done
if [ ${#vm[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "loom: installing ${vm[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${vm[@]}" >/dev/null
fi
