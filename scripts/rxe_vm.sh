#!/usr/bin/env bash
# Runs a command inside a QEMU virtual machine that boots Debian's own kernel with the
# rdma_rxe soft-RoCE driver: real verbs (RC queue pairs, RDMA WRITE/READ, RDMA CM) on a
# machine whose own kernel has no RDMA. The VM has no network device: RoCE runs over a
# dummy interface inside it.
#
#   scripts/rxe_vm.sh [--copy FILE]... [--timeout SEC] -- 'shell command'
#
# The initramfs (built once, kept in ${LOOM_RXE_DIR:-build/rxe}) holds busybox, the
# kernel's rdma_rxe and dummy modules with their dependencies, iproute2's `ip` and `rdma`,
# rdma-core's libibverbs with the rxe provider, ibverbs-utils, perftest's ib_write_bw (RDMA
# WRITE), and every --copy file
# (under the same path) with its shared libraries. Inside, the command runs as root with
# rxe0 (on dummy netdev rxenet0, 10.77.0.1/24) up (LOOM_RXE_PORTS=N: rxe0..rxe<N-1>, each
# on its own dummy netdev rxenet<i>, 10.77.<i>.1/24); its output is printed and its exit
# status is this script's (77 where the VM cannot run: no QEMU and no way to install it).
# Uses KVM when /dev/kvm is usable, software emulation otherwise.
set -euo pipefail

die() { echo "rxe_vm: $*" >&2; exit "${2:-1}"; }

repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${LOOM_RXE_DIR:-$repo/build/rxe}"
copies=() timeout=300
while (($#)); do
  case "$1" in
    --copy) copies+=("$2"); shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
(($#)) || die "no command (see --help)"
cmd="$*"

# Host tools: QEMU, a static busybox, iproute2, rdma-core's user space, depmod.
need=()
for p in qemu-system-x86 busybox-static iproute2 ibverbs-utils ibverbs-providers perftest kmod \
         cpio; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "rxe_vm: installing ${need[*]}" >&2
  SUDO=""; [[ $EUID -ne 0 ]] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends "${need[@]}" >/dev/null; } || die "cannot install ${need[*]}" 77
fi

# Debian's kernel, extracted without installing it. One run at a time per directory.
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [[ ! -f "$dir/vmlinuz" ]]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
  [[ -n "$pkg" ]] || die "no linux-image package for amd64 in apt's lists (apt-get update?)" 77
  rm -rf "$dir/kernel" && mkdir -p "$dir/kernel"
  (cd "$dir" && apt-get download "$pkg" >/dev/null 2>&1) ||
    die "apt-get download $pkg failed (stale apt lists? apt-get update)" 77
  dpkg-deb -x "$dir/$pkg"_*.deb "$dir/kernel"
  rm -f "$dir/$pkg"_*.deb
  kver=$(ls "$dir/kernel/lib/modules")
  /usr/sbin/depmod -b "$dir/kernel" "$kver"
  cp "$dir/kernel/boot/vmlinuz-$kver" "$dir/vmlinuz.tmp" && mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
fi
kver=$(ls "$dir/kernel/lib/modules")
mods="$dir/kernel/lib/modules/$kver"

root="$dir/root"
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,etc/libibverbs.d,lib/modules}

# Modules, dependencies first (modules.dep lists each module's, deepest last).
order=()
add_mod() {
  local m="$1" deps d
  for d in "${order[@]}"; do [[ "$d" == "$m" ]] && return; done
  deps=$(awk -v m="$m:" '$1 == m {for (i = NF; i > 1; i--) print $i}' "$mods/modules.dep")
  for d in $deps; do add_mod "$d"; done
  order+=("$m")
}
# rxe computes its ICRC with the kernel's crc32 crypto algorithm (a module of its own).
for m in crypto/crc32_generic.ko drivers/net/dummy.ko drivers/infiniband/sw/rxe/rdma_rxe.ko; do
  add_mod "kernel/$m"
done
for m in "${order[@]}"; do
  cp "$mods/$m" "$root/lib/modules/"
  echo "$(basename "$m")" >>"$root/modules.order"
done

# User space: busybox, then binaries with their libraries, at the paths they have here.
cp /bin/busybox "$root/bin/busybox"
copy_bin() {
  local f="$1" lib
  mkdir -p "$root$(dirname "$f")"
  cp -L "$f" "$root$f"
  for lib in $(ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib/ {print $1}'); do
    [[ -e "$root$lib" ]] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
for b in /usr/bin/ip /bin/ip /sbin/ip /usr/sbin/ip; do [[ -x "$b" ]] && { copy_bin "$b"; ipbin="$b"; break; }; done
rdmabin=$(command -v rdma || echo /usr/bin/rdma)
copy_bin "$rdmabin"
for b in /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ib_write_bw; do copy_bin "$b"; done
prov=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
copy_bin "$prov"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
for f in "${copies[@]}"; do copy_bin "$(readlink -f "$f")"; done
printf '%s\n' "$cmd" >"$root/cmd.sh"

cat >"$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/tmp
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
# /tmp stays the initramfs's own (writable): --copy files may live under it.
mkdir -p /dev/shm; mount -t tmpfs tmpfs /dev/shm
for m in \$(cat /modules.order); do insmod /lib/modules/\$m || echo "rxe_vm: insmod \$m failed"; done
$ipbin link set lo up
for i in \$(seq 0 $((${LOOM_RXE_PORTS:-1} - 1))); do
  $ipbin link add rxenet\$i type dummy && $ipbin addr add 10.77.\$i.1/24 dev rxenet\$i && $ipbin link set rxenet\$i up
  $rdmabin link add rxe\$i type rxe netdev rxenet\$i || echo "rxe_vm: rdma link add rxe\$i failed"
done
echo "RXE_VM_BEGIN"
sh /cmd.sh; rc=\$?
echo; echo "RXE_VM_EXIT=\$rc"
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$dir/initrd.gz")

accel=(-accel tcg)
# KVM only when asked (LOOM_RXE_ACCEL=kvm): nested KVM hung at boot here, and software
# emulation boots this kernel in seconds.
[[ "${LOOM_RXE_ACCEL:-tcg}" == kvm ]] && accel=(-accel kvm -cpu host)
out="$dir/console.log"
set +e
timeout -k 5 "$timeout" qemu-system-x86_64 "${accel[@]}" -m 1536 -smp 2 -nic none \
  -kernel "$dir/vmlinuz" -initrd "$dir/initrd.gz" \
  -append "console=ttyS0 panic=-1 ${LOOM_RXE_KERNEL_ARGS:-quiet loglevel=3}" -nographic -no-reboot \
  -serial mon:stdio </dev/null >"$out" 2>&1
qrc=$?
set -e
# Print what the command wrote (between the markers), without the boot chatter.
sed -n '/RXE_VM_BEGIN/,/RXE_VM_EXIT=/p' "$out" | tr -d '\r' | sed '1d;$d'
rc=$(tr -d '\r' <"$out" | sed -n 's/^RXE_VM_EXIT=\([0-9]*\)$/\1/p' | tail -1)
if [[ -z "$rc" ]]; then
  tr -d '\r' <"$out" | tail -30 >&2
  die "the VM did not finish the command (qemu exit $qrc; console in $out)"
fi
exit "$rc"
