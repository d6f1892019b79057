#!/usr/bin/env python3
"""Checks loom-doctor end to end by running the binary.

usage: loom_doctor_test.py <loom-doctor> <source dir> <case> <loom-topo>

Each case runs loom-doctor in a scrubbed environment (no LOOM_* / NCCL_* variables but the
ones the case sets) and fails with a message naming what differed. Cases that need a host
without GPUs (they merge topology fixtures over what is detected) exit 77, which CTest
reports as skipped, on a host that has GPUs.
"""
import json
import os
import re
import resource
import socket
import subprocess
import sys

from tool_test_util import expect, fail, run_tool  # noqa: F401

BIN, SRC, CASE, TOPO = sys.argv[1:5]
FIXTURES = os.path.join(SRC, "tests", "topo", "fixtures")
NAMES = ["knobs", "interface", "rendezvous", "rdma", "shm", "memlock", "open-files", "affinity",
         "gpus", "nvlink", "gpu-nic", "gdr"]
LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (\S+) +(.*?)(?:  => fix: (.*))?$")


def run(*args, env=None, rc=None, preexec=None, timeout=25):
    return run_tool(BIN, args, env=env, rc=rc, timeout=timeout, preexec=preexec)


def checks(out):
    """{name: (status, found, fix)} from the text report, which must be well formed."""
    lines = out.splitlines()
    expect(lines[0].startswith("loom-doctor: Loom "), f"first line {lines[0]!r}")
    got = {}
    for line in lines[1:-1]:
        if line.startswith("      "):
            continue  # --verbose detail
        m = LINE.match(line)
        expect(m, f"malformed check line {line!r}")
        expect(m.group(2) not in got, f"check {m.group(2)} printed twice")
        expect((m.group(4) is not None) == (m.group(1) in ("WARN", "FAIL")),
               f"a WARN or FAIL, and only those, names a fix: {line!r}")
        got[m.group(2)] = (m.group(1), m.group(3), m.group(4) or "")
    m = re.match(r"^(\d+) PASS, (\d+) WARN, (\d+) FAIL, (\d+) SKIP$", lines[-1])
    expect(m, f"no summary line: {lines[-1]!r}")
    counts = [sum(1 for s, _, _ in got.values() if s == k) for k in ("PASS", "WARN", "FAIL", "SKIP")]
    expect([int(x) for x in m.groups()] == counts, f"summary {lines[-1]!r} vs checks {counts}")
    expect(all(n in got for n in NAMES), f"checks {sorted(got)} lack some of {NAMES}")
    return got


def report(*args, env=None, preexec=None):
    """Runs the doctor, checks its exit status against its own verdicts, returns the checks."""
    p = run(*args, env=env, preexec=preexec)
    got = checks(p.stdout)
    failed = any(s == "FAIL" for s, _, _ in got.values())
    expect(p.returncode == (1 if failed else 0), f"exit {p.returncode} with FAIL={failed}\n{p.stdout}")
    return got, p.stdout


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def without_gpus():
    doc = json.loads(run("--json", "--no-sweep").stdout)
    gpus = next(c for c in doc["checks"] if c["name"] == "gpus")
    if gpus["facts"]["count"] != 0:
        print("SKIP: this host has GPUs; the fixture cases assume it has none")
        sys.exit(77)


def case_interface():
    got, _ = report("--no-sweep", env={"NCCL_SOCKET_IFNAME": "doesnotexist0"})
    status, found, fix = got["interface"]
    expect(status == "FAIL" and "doesnotexist0" in found, f"interface: {got['interface']}")
    m = re.search(r"NCCL_SOCKET_IFNAME==(\S+)", fix)
    expect(m and os.path.exists(f"/sys/class/net/{m.group(1)}"), f"the fix names no real interface: {fix!r}")
    # The suggested setting works.
    got, _ = report("--no-sweep", env={"NCCL_SOCKET_IFNAME": "=" + m.group(1)})
    expect(got["interface"][0] in ("PASS", "WARN") and f"use {m.group(1)} " in got["interface"][1],
           f"with the suggested NCCL_SOCKET_IFNAME: {got['interface']}")
    got, _ = report("--no-sweep", env={"NCCL_SOCKET_IFNAME": "=lo"})
    expect(got["interface"][0] == "PASS" and "use lo 127.0.0.1" in got["interface"][1], f"=lo: {got['interface']}")
    # The sweep cannot start without an interface, and says why instead of failing twice.
    got, _ = report("--ranks", "2", env={"NCCL_SOCKET_IFNAME": "doesnotexist0"})
    expect(got["allreduce-2"][0] == "SKIP" and "interface" in got["allreduce-2"][1], f"sweep: {got['allreduce-2']}")


def case_rendezvous():
    got, _ = report("--no-sweep")
    expect(got["rendezvous"][0] == "SKIP" and "NCCL_COMM_ID unset" in got["rendezvous"][1], f"{got['rendezvous']}")
    port = closed_port()
    # Another host's address (127.0.0.2 is no interface's) refusing: nothing listens there.
    got, _ = report("--no-sweep", env={"NCCL_COMM_ID": f"127.0.0.2:{port}"})
    status, found, fix = got["rendezvous"]
    expect(status == "FAIL" and "refused" in found and "start rank 0" in fix, f"refused: {got['rendezvous']}")
    # This host's address with the port free: rank 0 can run the root here.
    got, _ = report("--no-sweep", env={"NCCL_COMM_ID": f"127.0.0.1:{port}"})
    expect(got["rendezvous"][0] == "PASS" and "rank 0 must run here" in got["rendezvous"][1], f"{got['rendezvous']}")
    # This host's address with the port taken: rank 0 could not bind it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        got, _ = report("--no-sweep", env={"NCCL_COMM_ID": f"127.0.0.1:{busy}"})
    status, found, fix = got["rendezvous"]
    expect(status == "WARN" and "already listens" in found and f"sport = :{busy}" in fix, f"busy: {got['rendezvous']}")
    got, _ = report("--no-sweep", env={"NCCL_COMM_ID": "no-such-host.invalid:29500"})
    expect(got["rendezvous"][0] == "FAIL" and "no-such-host.invalid" in got["rendezvous"][1], f"{got['rendezvous']}")


def sweep_rows(text):
    return re.findall(r"^ +(\d+ (?:B|KiB|MiB)) (\w+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", text, re.M)


def case_sweep():
    # A generous factor: this asserts correctness and the report, not this machine's speed.
    got, out = report("--ranks", "3", "--factor", "1000", "-v")
    for n in ("allreduce-2", "allreduce-3"):
        status, found, _ = got[n]
        expect(status == "PASS", f"{n}: {got[n]}")
        expect(re.search(r"\d ranks \(threads\), 5 sizes 8 B\.\.4 MiB, every result exact", found), f"{n}: {found}")
    rows = sweep_rows(out)
    expect([r[0] for r in rows] == ["8 B", "1 KiB", "64 KiB", "1 MiB", "4 MiB"] * 2, f"sweep tables: {rows}")
    doc = json.loads(run("--ranks", "2", "--factor", "1000", "--json").stdout)
    sweep = next(c for c in doc["checks"] if c["name"] == "allreduce-2")
    sizes = sweep["facts"]["sizes"]
    expect([s["bytes"] for s in sizes] == [8, 1024, 65536, 1 << 20, 4 << 20], f"sizes {sizes}")
    for s in sizes:
        expect(s["correct"] and s["predictedUs"] > 0 and s["bestUs"] > 0 and s["medianUs"] >= s["bestUs"], f"{s}")
        expect(abs(s["ratio"] - s["bestUs"] / s["predictedUs"]) < 0.01 * s["ratio"] + 1e-3, f"ratio {s}")
        expect(s["bestUs"] <= 1000 * s["predictedUs"] + 50, f"{s} passed above its limit")
    # The prediction is the one loom-topo shows for this host (2 ranks, host memory).
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "NCCL_"))}
    t = json.loads(subprocess.run([TOPO, "--json", "--nranks", "2", "--host-memory"], capture_output=True, text=True,
                                  env=clean, timeout=25).stdout)
    rows = {r["bytes"]: r for r in t["tuning"] if r["collective"] == "AllReduce"}
    for s in sizes:
        want = rows[s["bytes"]]
        expect(abs(want["predicted_us"] - s["predictedUs"]) <= 1e-3 * want["predicted_us"] and
               want["algorithm"] == s["algorithm"], f"{s} vs loom-topo's {want}")
    got, _ = report("--no-sweep")
    expect(got["allreduce"][0] == "SKIP", f"--no-sweep: {got.get('allreduce')}")


def case_json():
    p = run("--json", "--no-sweep", env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "doesnotexist0"}, rc=1)
    doc = json.loads(p.stdout)  # library logs went to stderr
    names = [c["name"] for c in doc["checks"]]
    expect(names == NAMES + ["allreduce"], f"names {names}")
    for c in doc["checks"]:
        expect(c["status"] in ("PASS", "WARN", "FAIL", "SKIP") and c["found"], f"{c}")
        expect(bool(c["fix"]) == (c["status"] in ("WARN", "FAIL")), f"fix only with WARN/FAIL: {c}")
    by = {c["name"]: c for c in doc["checks"]}
    expect(by["interface"]["status"] == "FAIL" and by["interface"]["facts"]["spec"] == "doesnotexist0",
           f"{by['interface']}")
    counts = {k.lower(): sum(c["status"] == k for c in doc["checks"]) for k in ("PASS", "WARN", "FAIL", "SKIP")}
    expect(doc["summary"] == counts, f"summary {doc['summary']} vs {counts}")
    # Facts match what Python sees of the same process environment.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    expect(by["open-files"]["facts"] == {"soft": soft, "hard": hard}, f"open files {by['open-files']}")
    st = os.statvfs("/dev/shm")
    expect(by["shm"]["facts"]["sizeBytes"] == st.f_blocks * st.f_frsize, f"shm {by['shm']}")
    rdma = os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")
    expect((by["rdma"]["status"] == "SKIP") == (not rdma), f"rdma {by['rdma']} with devices {rdma}")


def case_limits():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1024 or hard < 4096:
        print("SKIP: needs a hard open-files limit of at least 4096")
        sys.exit(77)
    got, _ = report("--no-sweep", preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard)))
    status, found, fix = got["open-files"]
    expect(status == "WARN" and "ulimit -n 1024" in found and f"ulimit -n {min(hard, 65536)}" in fix,
           f"open files at 1024: {got['open-files']}")
    if len(os.sched_getaffinity(0)) > 1:
        got, _ = report("--no-sweep", preexec=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
        expect(got["affinity"][0] == "WARN" and "shares one core" in got["affinity"][1], f"one CPU: {got['affinity']}")


def case_knobs():
    got, _ = report("--no-sweep", env={"LOOM_SLOT_BYTES": "abc"})
    expect(got["knobs"][0] == "FAIL" and "LOOM_SLOT_BYTES=abc" in got["knobs"][1], f"{got['knobs']}")
    got, _ = report("--ranks", "2", env={"NCCL_ALGO": "Bogus"})
    expect(got["knobs"][0] == "FAIL" and "NCCL_ALGO=Bogus" in got["knobs"][1], f"{got['knobs']}")
    expect(got["allreduce-2"][0] == "FAIL" and "NCCL_ALGO=Bogus" in got["allreduce-2"][1], f"{got['allreduce-2']}")
    got, _ = report("--no-sweep", env={"NCCL_SOCKET_IFNAM": "eth0"})
    expect(got["knobs"][0] == "WARN" and "did you mean NCCL_SOCKET_IFNAME" in got["knobs"][1], f"{got['knobs']}")
    # NCCL's own tuning that Loom does not read is named, not flagged (stock NCCL reads it).
    got, _ = report("--no-sweep", env={"NCCL_P2P_LEVEL": "NVL", "NCCL_BUFFSIZE": "8M"})
    expect(got["knobs"][0] == "PASS" and "not read by Loom" in got["knobs"][1]
           and "NCCL_P2P_LEVEL" in got["knobs"][1] and "NCCL_BUFFSIZE" in got["knobs"][1], f"{got['knobs']}")


def case_topology():
    without_gpus()
    got, _ = report("--no-sweep")
    expect(got["gpus"][0] == "SKIP" and got["gpus"][1].startswith("no GPU found"), f"{got['gpus']}")
    expect(got["nvlink"][0] == "SKIP" and got["gdr"][0] == "SKIP", f"{got['nvlink']} {got['gdr']}")
    got, _ = report("--no-sweep", env={"NCCL_TOPO_FILE": os.path.join(FIXTURES, "dgx_h100.xml")})
    expect(got["gpus"][0] == "PASS" and got["gpus"][1].startswith("8 GPU(s)") and "sm90" in got["gpus"][1],
           f"{got['gpus']}")
    expect(got["nvlink"] == ("PASS", "28 GPU pair(s): 28 NVL (through NVSwitch)", ""), f"{got['nvlink']}")
    expect(got["gpu-nic"][0] == "PASS" and got["gpu-nic"][1].count(" PIX") == 8, f"{got['gpu-nic']}")
    got, _ = report("--no-sweep", env={"NCCL_TOPO_FILE": os.path.join(FIXTURES, "pcie8_2socket.xml")})
    expect(got["nvlink"][0] == "PASS" and "no NVLink" in got["nvlink"][1], f"{got['nvlink']}")
    expect(got["gpu-nic"][0] == "WARN" and "4 of 8 GPUs" in got["gpu-nic"][1], f"{got['gpu-nic']}")
    # One GPU of an NVLink mesh loses its links: its pairs fall back to PCIe.
    with open(os.path.join(FIXTURES, "nvlink_mesh4.xml")) as f:
        xml = f.read()
    xml = re.sub(r'\s*<nvlink target="0000:04:00.0"[^>]*/>', "", xml)
    xml = re.sub(r'(<gpu dev="3" sm="70">)(.*?)(</gpu>)', r"\1\3", xml, flags=re.S)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"loom_doctor_mesh_{os.getpid()}.xml")
    with open(path, "w") as f:
        f.write(xml)
    try:
        got, _ = report("--no-sweep", env={"NCCL_TOPO_FILE": path})
    finally:
        os.unlink(path)
    status, found, fix = got["nvlink"]
    expect(status == "WARN" and "3 NVL" in found and "GPU3" in found and "nvidia-smi" in fix, f"{got['nvlink']}")


def case_usage():
    for args in (["--bogus"], ["--ranks"], ["--ranks", "1"], ["--ranks", "2.5"], ["--factor", "x"], ["extra"]):
        p = run(*args, rc=2)
        expect(p.stdout == "" and "loom-doctor:" in p.stderr and "usage:" in p.stderr, f"{args}: {p.stderr!r}")
    p = run("--help", rc=0)
    expect("--no-sweep" in p.stdout and "--ranks N" in p.stdout, f"--help: {p.stdout!r}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
if CASE not in CASES:
    fail(f"unknown case {CASE}; cases: {sorted(CASES)}")
CASES[CASE]()
print("PASS", CASE)
