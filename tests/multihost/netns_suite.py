#!/usr/bin/env python3
"""Multi-host tests on one machine: each emulated host is a Linux network namespace with an
address of its own on a bridged 10.213.0.0/24 (fabric.py); ranks run in them under
`ip netns exec`, find rank 0 through NCCL_COMM_ID=10.213.0.1:<port>, and reach each other
over the veth interface picked by NCCL_SOCKET_IFNAME. mh_rank checks every collective's
result exactly; this script checks what the communicator saw (the INIT log: ranks per host,
shm within a namespace, socket between), that ranks really ran in their namespaces, and
that nothing hangs.

  netns_suite.py <mh_rank binary> <case>

Cases:
  2x2          2 hosts x 2 ranks, every collective, default algorithm choice
  uneven       3 hosts with 2 + 1 + 3 ranks
  algos        2 x 2 once per NCCL_ALGO (ring, tree, halvingdoubling, direct, hierarchical)
  hostid       2 x 2 with one LOOM_HOSTID for all: the override wins, shm across namespaces
  kill-shared  2 x 2, rank 3 SIGKILLed mid all-reduce: every other rank gets an error
  kill-lone    2 + 1 + 3, the only rank of host 1 killed
  bad-ifname   NCCL_SOCKET_IFNAME naming no interface: every rank fails with a message
  default-ifname  1 + 2 without NCCL_SOCKET_IFNAME: the default choice (not lo) must work
  partition    2 x 2, host 1's link set down mid all-reduce: every rank errors by LOOM_TIMEOUT
  partition-default  the same without configuration: every rank errors within 10 s
               (LOOM_SOCKET_TIMEOUT's keepalive / TCP_USER_TIMEOUT, 8 s)

Exit status: 0 pass, 1 fail, 77 skipped (only with LOOM_SKIP_NETNS=1). Without root, or
where namespaces cannot be made, the suite fails: CI runs as root and must not pass by
doing nothing.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fabric  # noqa: E402

PORT = 29500
RUN_TIMEOUT = 120     # seconds for one run of all ranks: a hang fails, it does not block CI
KILL_NOTICE = 60      # seconds the survivors get to report the dead rank
SILENT_NOTICE = 10    # ... a silent host, with no configuration (issue 6; LOOM_SOCKET_TIMEOUT: 8 s)
PARTITION_TIMEOUT = "5"   # LOOM_TIMEOUT for the partition case (the socket time-out set longer)
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def clean_env():
    """The caller's NCCL_*/LOOM_* settings must not steer the ranks."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LOOM_"))}


class Job:
    """One rank per entry of `placement` (the host index of each rank)."""

    def __init__(self, fab, binary, placement, workdir, env=None, mode="check"):
        self.placement = placement
        self.workdir = workdir
        self.procs = []
        for rank, host in enumerate(placement):
            e = clean_env()
            e.update({
                "RANK": str(rank), "WORLD_SIZE": str(len(placement)),
                "LOCAL_RANK": str(placement[:rank].count(host)),
                "NCCL_COMM_ID": "%s:%d" % (fab.address(0), PORT),
                "NCCL_SOCKET_IFNAME": fabric.IFNAME,
                "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,TUNING",
                "NCCL_DEBUG_FILE": self.log(rank),
                # A stall must end through failure detection, never through this time-out.
                "LOOM_TIMEOUT": "600",
                "MH_MODE": mode,
            })
            for k, v in (env or {}).items():
                if v is None:
                    e.pop(k, None)
                else:
                    e[k] = v
            out = open(self.out(rank), "w")
            self.procs.append(subprocess.Popen(fab.exec_prefix(host) + [binary], env=e,
                                               stdin=subprocess.PIPE, stdout=out,
                                               stderr=subprocess.STDOUT))
            out.close()

    def out(self, rank):
        return os.path.join(self.workdir, "rank%d.out" % rank)

    def log(self, rank):
        return os.path.join(self.workdir, "rank%d.log" % rank)

    def text(self, rank):
        with open(self.out(rank), errors="replace") as f:
            return f.read()

    def wait(self, timeout=RUN_TIMEOUT):
        """Exit codes of all ranks; a rank still running at the deadline is a hang."""
        for p in self.procs:
            p.stdin.close()  # ranks that wait on stdin after an error may now exit
        deadline = time.monotonic() + timeout
        codes = []
        for rank, p in enumerate(self.procs):
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                fail("rank %d still running after %d s (hang); output:\n%s" % (rank, timeout, self.text(rank)))
                self.kill()
                codes.append(None)
        return codes

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def dump(self):
        for rank in range(len(self.procs)):
            print("---- rank %d (host %d) output:\n%s" % (rank, self.placement[rank], self.text(rank)), flush=True)


def log_text(job, rank):
    try:
        with open(job.log(rank), errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def allreduce_choices(job):
    """Algorithms the tuner's log says rank 0 chose for all-reduces (empty if it says none)."""
    return re.findall(r"AllReduce of \d+ bytes.*?-> (\w+)", log_text(job, 0))


def init_line(job, rank):
    return next((l.strip() for l in log_text(job, rank).splitlines() if "Init COMPLETE" in l), None)


def check_topology(job, same_host, network="socket"):
    """Each rank's INIT line: localRanks is its host's rank count, and every connected peer
    is reached over shm exactly when same_host(me, peer), else over `network`."""
    n = len(job.placement)
    kinds = set()
    for rank in range(n):
        line = init_line(job, rank)
        if not line:
            fail("rank %d wrote no 'Init COMPLETE' line to %s" % (rank, job.log(rank)))
            continue
        print("rank %d: %s" % (rank, line[line.find("rank "):]))
        m = re.search(r"localRanks (\d+) transports \[([^\]]*)\]", line)
        if not m:
            fail("rank %d: cannot read localRanks/transports from: %s" % (rank, line))
            continue
        local = sum(1 for p in range(n) if same_host(rank, p))
        if int(m.group(1)) != local:
            fail("rank %d sees %s local ranks, expected %d" % (rank, m.group(1), local))
        for peer, kind in re.findall(r"(\d+):([\w/]+)", m.group(2)):
            peer = int(peer)
            want = "shm" if same_host(rank, peer) else network
            kinds.add(kind)
            if kind != want:
                fail("rank %d reaches rank %d over %s, expected %s" % (rank, peer, kind, want))
    # The tuner's log says how many hosts it sees ("<n> ranks on <h> host(s)"); where it
    # does, that must be the number of emulated hosts.
    hosts = len({tuple(p for p in range(n) if same_host(r, p)) for r in range(n)})
    seen = set()
    for rank in range(n):
        for m in re.finditer(r"\d+ ranks on (\d+) host", log_text(job, rank)):
            seen.add(int(m.group(1)))
    if seen and seen != {hosts}:
        fail("the tuner saw %s host(s), expected %d" % (sorted(seen), hosts))
    if seen:
        print("tuner: %d ranks on %d host(s)" % (n, hosts))
    return kinds


def check_namespaces(job):
    """Ranks report their netns inode: one per host, different hosts different."""
    seen = {}
    for rank, host in enumerate(job.placement):
        m = re.search(r"pid (\d+) netns (\d+)", job.text(rank))
        if not m:
            fail("rank %d did not report its namespace" % rank)
            continue
        seen.setdefault(host, set()).add(m.group(2))
    if any(len(v) != 1 for v in seen.values()) or len({min(v) for v in seen.values()}) != len(seen):
        fail("ranks' network namespaces do not follow the placement: %s" % seen)


def run_check(fab, binary, placement, workdir, env=None, same_host=None, label="",
              network="socket", mode="check"):
    job = Job(fab, binary, placement, workdir, env=env, mode=mode)
    codes = job.wait()
    ok = True
    for rank, code in enumerate(codes):
        text = job.text(rank)
        if code != 0 or not re.search(r"OK \d+ checks", text):
            ok = False
            fail("%srank %d exited %s" % (label, rank, code))
    if not ok:
        job.dump()
    check_namespaces(job)
    same_host = same_host or (lambda a, b: placement[a] == placement[b])
    kinds = check_topology(job, same_host, network)
    checks = [re.search(r"OK (\d+) checks", job.text(r)) for r in range(len(placement))]
    print("%s%d ranks in %d namespaces: %s checks passed, transports used: %s" % (
        label, len(placement), len(set(placement)),
        "/".join(c.group(1) if c else "?" for c in checks), ", ".join(sorted(kinds))), flush=True)
    return kinds, job


def case_collectives(fab, binary, placement, workdir):
    kinds, job = run_check(fab, binary, placement, workdir)
    chosen = allreduce_choices(job)
    if chosen:
        print("default choice: all-reduce ran as %s" % ", ".join(sorted(set(chosen))))
    want = {"socket"} | ({"shm"} if len(set(placement)) < len(placement) else set())
    if kinds != want:
        fail("transports used %s, expected %s" % (sorted(kinds), sorted(want)))


def case_plugin(fab, binary, placement, workdir):
    """An NCCL net plugin (Loom's test plugin, v11, listening on the namespace's own address)
    serves every pair of hosts; no NCCL_NET: the first plugin that starts is used."""
    plugin = os.environ.get("LOOM_TEST_NET_PLUGIN")
    if not plugin or not os.path.exists(plugin):
        fail("LOOM_TEST_NET_PLUGIN does not name the test plugin: %r" % plugin)
        return
    kinds, _ = run_check(fab, binary, placement, workdir,
                         env={"NCCL_NET_PLUGIN": plugin, "LOOM_TEST_NET_ADDR": "auto",
                              "NCCL_NET": None},
                         network="net/LoomTest")
    want = {"net/LoomTest"} | ({"shm"} if len(set(placement)) < len(placement) else set())
    if kinds != want:
        fail("transports used %s, expected %s" % (sorted(kinds), sorted(want)))


def case_ucx(fab, binary, placement, workdir, net="UCX"):
    """NCCL_NET=UCX: UCX over tcp on each namespace's own interface serves every pair of
    hosts (UCX_NET_DEVICES pinned; shared memory stays Loom's within a host)."""
    kinds, _ = run_check(fab, binary, placement, workdir,
                         env={"NCCL_NET": net, "UCX_TLS": "tcp",
                              "UCX_NET_DEVICES": fabric.IFNAME},
                         network="net/" + net)
    want = {"net/" + net} | ({"shm"} if len(set(placement)) < len(placement) else set())
    if kinds != want:
        fail("transports used %s, expected %s" % (sorted(kinds), sorted(want)))


def case_device(fab, binary, placement, workdir):
    """Device buffers on the device executor (LOOM_DEVICE_EXECUTOR=kernel) across hosts: every
    check on memory of Loom's stand-in CUDA driver, each collective the stand-in kernels
    module's plan-interpreter launch; ranks of one namespace join through (stand-in) CUDA
    IPC, ranks of others through the network (Loom's TCP backend, NCCL_NET unset), pumped
    by the executor's proxy thread. Every rank must say so at init and launch kernels."""
    drv, kern = os.environ.get("LOOM_TEST_CUDA_DRIVER"), os.environ.get("LOOM_TEST_CUDA_KERNELS")
    if not drv or not kern or not os.path.exists(drv) or not os.path.exists(kern):
        fail("LOOM_TEST_CUDA_DRIVER / LOOM_TEST_CUDA_KERNELS do not name the stand-ins: %r %r" % (drv, kern))
        return
    _, job = run_check(fab, binary, placement, workdir, mode="device",
                       env={"LOOM_CUDA_DRIVER_LIBRARY": drv, "LOOM_CUDA_KERNELS_LIBRARY": kern,
                            "LOOM_DEVICE_EXECUTOR": "kernel", "LOOM_NCCL_FALLBACK": "off",
                            "NCCL_NET": None, "NCCL_DEBUG_SUBSYS": "INIT,TUNING,COLL"})
    for rank in range(len(placement)):
        text = log_text(job, rank)
        if "device buffers run on the device executor" not in text:
            fail("rank %d: the device executor does not serve its device buffers" % rank)
        if "other hosts through net/Socket" not in text:
            fail("rank %d: no network for the device executor's peers on other hosts" % rank)
        launches = text.count("by the device executor's kernel")
        remote = len(re.findall(r"device FIFO (?:to|from) rank \d+ \(#\d+\) through net/Socket", text))
        if launches == 0 or remote == 0:
            fail("rank %d: %d kernel launches, %d network FIFO ends" % (rank, launches, remote))
        print("rank %d: %d kernel launches, %d network FIFO ends" % (rank, launches, remote), flush=True)


def case_algos(fab, binary, placement, workdir):
    for algo in ("ring", "tree", "halvingdoubling", "direct", "hierarchical"):
        if failures:
            break  # one hang is enough to report; do not stack time-outs past CTest's
        sub = os.path.join(workdir, algo)
        os.mkdir(sub)
        _, job = run_check(fab, binary, placement, sub, env={"NCCL_ALGO": algo},
                           label="NCCL_ALGO=%s: " % algo)
        # Where the tuner logs its choices, the forced algorithm must be among them (it may
        # fall back where it cannot serve a size, e.g. direct above a FIFO).
        chosen = allreduce_choices(job)
        if chosen:
            print("NCCL_ALGO=%s: all-reduce ran as %s" % (algo, ", ".join(sorted(set(chosen)))))
            if algo not in {c.lower() for c in chosen}:
                fail("NCCL_ALGO=%s: the tuner never chose it for all-reduce: %s" % (algo, sorted(set(chosen))))


def case_hostid(fab, binary, placement, workdir):
    kinds, _ = run_check(fab, binary, placement, workdir, env={"LOOM_HOSTID": "one-big-host"},
                      same_host=lambda a, b: True)
    if kinds != {"shm"}:
        fail("with one LOOM_HOSTID every connection should be shm, saw %s" % sorted(kinds))


def case_failure(fab, binary, placement, workdir, inject, victims=(), env=None, expect=None,
                 notice=KILL_NOTICE):
    """Ranks loop on all-reduces; once all are into the loop (so the failure lands
    mid-collective), `inject` breaks something; every rank but `victims` must then return
    an error (whose message contains `expect`, if given) within `notice` seconds."""
    job = Job(fab, binary, placement, workdir, mode="loop", env=env)
    n = len(placement)
    survivors = [r for r in range(n) if r not in victims]
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not all("iteration 2" in job.text(r) for r in range(n)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in job.procs):
                fail("ranks did not all reach iteration 2")
                job.dump()
                return
            time.sleep(0.05)
        print(inject(job), flush=True)
        broken = time.monotonic()
        noticed = {}
        while len(noticed) < len(survivors) and time.monotonic() - broken < notice:
            for r in survivors:
                if r not in noticed and "ERROR" in job.text(r):
                    noticed[r] = time.monotonic() - broken
            time.sleep(0.05)
        lines = {}
        for r in survivors:
            line = next((l for l in job.text(r).splitlines() if "ERROR" in l), None)
            if r not in noticed:
                fail("rank %d (host %d) reported no error %d s after the failure (hang)"
                     % (r, placement[r], notice))
                continue
            lines[r] = line
            print("rank %d (host %d) failed after %.2f s: %s" % (r, placement[r], noticed[r], line))
        for r, line in lines.items():
            if not expect or expect in line:
                continue
            # A rank waiting on a local peer sees that peer close its connections when the
            # peer's own wait ends first: the error names the peer, and the peer's error
            # must carry the cause.
            m = re.search(r"rank (\d+) \([^)]*\) via shm: the peer closed the connection", line)
            peer = int(m.group(1)) if m else -1
            if peer in lines and placement[peer] == placement[r] and expect in lines[peer]:
                print("rank %d: ended by local rank %d's failure, which mentions '%s'" % (r, peer, expect))
                continue
            fail("rank %d: the error does not mention '%s'" % (r, expect))
    finally:
        codes = job.wait(timeout=30)  # closes the survivors' stdin: they exit now
    for r in survivors:
        if codes[r] != 3:
            fail("rank %d exited %s after the error, expected 3" % (r, codes[r]))
    if failures:
        job.dump()


def case_kill(fab, binary, placement, workdir, victim):
    def kill(job):
        pid = int(re.search(r"pid (\d+)", job.text(victim)).group(1))
        os.kill(pid, 9)
        return "killed rank %d (host %d, pid %d)" % (victim, placement[victim], pid)
    case_failure(fab, binary, placement, workdir, kill, victims=(victim,))


def case_partition(fab, binary, placement, workdir):
    # A link that goes silent sends no reset: only the stall time-out can end the wait, and
    # it must, on every rank, naming LOOM_TIMEOUT (or, on a rank whose local peer timed
    # out first and closed their shared-memory connection, naming that peer).
    def unplug(job):
        fabric._ip("-n", fab.hosts[1], "link", "set", fabric.IFNAME, "down")
        return "unplugged host 1 (LOOM_TIMEOUT=%s)" % PARTITION_TIMEOUT
    case_failure(fab, binary, placement, workdir, unplug,
                 env={"LOOM_TIMEOUT": PARTITION_TIMEOUT, "LOOM_SOCKET_TIMEOUT": "60"},
                 expect="LOOM_TIMEOUT")


def case_partition_default(fab, binary, placement, workdir):
    # The same with no configuration at all: TCP keepalive and TCP_USER_TIMEOUT
    # (LOOM_SOCKET_TIMEOUT, 8 s) find the silent peer, well before LOOM_TIMEOUT's 30 min.
    def unplug(job):
        fabric._ip("-n", fab.hosts[1], "link", "set", fabric.IFNAME, "down")
        return "unplugged host 1 (no time-out configured)"
    case_failure(fab, binary, placement, workdir, unplug, notice=SILENT_NOTICE)


def case_bad_ifname(fab, binary, placement, workdir):
    job = Job(fab, binary, placement, workdir, env={"NCCL_SOCKET_IFNAME": "=nosuch0"})
    codes = job.wait(timeout=60)
    for r, code in enumerate(codes):
        text = job.text(r)
        if code != 3 or "matches no usable network interface" not in text or fabric.IFNAME not in text:
            fail("rank %d: expected exit 3 and an error naming the interfaces here (%s), got %s:\n%s"
                 % (r, fabric.IFNAME, code, text))
        else:
            print("rank %d: %s" % (r, next(l for l in text.splitlines() if "ERROR" in l)))


def case_default_ifname(fab, binary, placement, workdir):
    run_check(fab, binary, placement, workdir, env={"NCCL_SOCKET_IFNAME": None})


CASES = {
    "2x2": ([0, 0, 1, 1], case_collectives),
    "uneven": ([0, 0, 1, 2, 2, 2], case_collectives),
    "algos": ([0, 0, 1, 1], case_algos),
    "plugin": ([0, 0, 1, 2], case_plugin),
    "ucx": ([0, 0, 1, 2, 2], case_ucx),
    "device": ([0, 0, 1], case_device),
    "hostid": ([0, 0, 1, 1], case_hostid),
    "kill-shared": ([0, 0, 1, 1], lambda f, b, p, w: case_kill(f, b, p, w, victim=3)),
    "kill-lone": ([0, 0, 1, 2, 2, 2], lambda f, b, p, w: case_kill(f, b, p, w, victim=2)),
    "bad-ifname": ([0, 1], case_bad_ifname),
    "default-ifname": ([0, 1, 1], case_default_ifname),
    "partition": ([0, 0, 1, 1], case_partition),
    "partition-default": ([0, 0, 1, 1], case_partition_default),
}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        sys.exit("usage: netns_suite.py <mh_rank binary> {%s}" % "|".join(CASES))
    binary, case = os.path.abspath(sys.argv[1]), sys.argv[2]
    if os.environ.get("LOOM_SKIP_NETNS") == "1":
        print("SKIPPED: LOOM_SKIP_NETNS=1, multi-host namespace case '%s' not run" % case)
        return 77
    placement, fn = CASES[case]
    try:
        with tempfile.TemporaryDirectory(prefix="loom-netns-") as workdir, \
                fabric.Fabric(len(set(placement))) as fab:
            print("hosts: %s at %s" % (", ".join(fab.hosts),
                                       ", ".join(fab.address(k) for k in range(fab.nhosts))), flush=True)
            fn(fab, binary, placement, workdir)
    except fabric.NetnsUnavailable as e:
        print("FAIL: cannot create network namespaces: %s.\n"
              "The multi-host suite needs root and iproute2; set LOOM_SKIP_NETNS=1 to skip it "
              "on machines that cannot." % e, flush=True)
        return 1
    except fabric.Terminated as e:
        print("FAIL: %s; namespaces removed" % e, flush=True)
        return 1
    if failures:
        print("%d failure(s) in case %s" % (len(failures), case))
        return 1
    print("PASS: %s" % case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
