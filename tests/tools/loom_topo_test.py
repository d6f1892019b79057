#!/usr/bin/env python3
"""Checks loom-topo's --plan and its selector table end to end by running the binary.

usage: loom_topo_test.py <loom-topo> <source dir> <case>

Each case runs loom-topo on the topology fixtures of tests/topo in a scrubbed environment
(no LOOM_* / NCCL_* variables but the ones the case sets) and fails with a message naming
what differed.
"""
import json
import os
import re
import subprocess
import sys

from tool_test_util import expect, fail, run_tool  # noqa: F401

BIN, SRC, CASE = sys.argv[1:4]
FIXTURES = os.path.join(SRC, "tests", "topo", "fixtures")


def run(*args, env=None, rc=0):
    p = run_tool(BIN, args, env=env, rc=rc, timeout=120)
    return p.stdout, p.stderr


def topo(name):
    return ["--topo-file", os.path.join(FIXTURES, name)]


def selected(out):
    """(algorithm, protocol, channels, chunk) from --plan's "Selected:" line."""
    m = re.search(r"^Selected: (\w+)/(\w+), (\d+) channel\(s\), chunk (\S+?);", out, re.M)
    expect(m, f"no Selected: line in\n{out}")
    return m.group(1), m.group(2), int(m.group(3)), m.group(4)


def plan_steps(out):
    """The plan's step lines: (channel, op, bytes, to, from)."""
    steps = []
    for m in re.finditer(r"^  ch(\d+) (\w+)\s+bytes=(\d+)\s.*?to=(-?\d+) from=(-?\d+)", out, re.M):
        steps.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))))
    return steps


def case_plan_text():
    out, _ = run("--plan", "allreduce", "1M", "--nranks", "4", *topo("cpu_only.xml"))
    expect(out.startswith("AllReduce of 1048576 bytes per rank (262144 x 4-byte elements), 4 ranks on 1 host(s), "
                          "host memory"), out)
    algo, proto, ch, _ = selected(out)
    expect(proto == "Simple", f"host memory runs Simple only, got {proto}")
    expect("Simulated: every rank finished with the exact result" in out, out)
    expect(re.search(r"^Plan of rank 0 \(\d+ steps", out, re.M), out)
    expect(re.search(rf"^AllReduce/{algo}, {ch} channel\(s\)$", out, re.M), f"plan header does not match\n{out}")
    steps = plan_steps(out)
    expect(steps, f"no steps printed\n{out}")
    # Rank 0 moves the message: what it sends adds up to what the algorithm sends.
    expect(sum(b for _, op, b, to, _ in steps if to >= 0) > 0, out)
    # The same selection loom-topo's table shows for that size.
    table, _ = run("--json", "--nranks", "4", *topo("cpu_only.xml"))
    rows = [r for r in json.loads(table)["tuning"] if r["collective"] == "AllReduce" and r["bytes"] == 1 << 20]
    expect(len(rows) == 1 and rows[0]["algorithm"] == algo and rows[0]["channels"] == ch,
           f"table says {rows}, --plan says {algo} on {ch} channel(s)")
    expect("chunk_bytes" in rows[0], f"{rows[0]}")


def case_plan_tuner():
    """With NCCL_TUNER_PLUGIN set, loom-topo shows what a communicator would run: Loom's test
    plugin (mode "tree") makes all-reduce the tree on 3 channels, in --plan, the table and the
    JSON, and names the plugin."""
    plugin = os.environ["LOOM_TEST_TUNER_PLUGIN"]
    env = {"NCCL_TUNER_PLUGIN": plugin, "LOOM_TEST_TUNER_MODE": "tree"}
    out, _ = run("--plan", "allreduce", "1M", "--nranks", "4", *topo("cpu_only.xml"), env=env)
    expect(f"tuner plugin: LoomTestTuner (v4, {plugin}) (NCCL_TUNER_PLUGIN)" in out, out)
    algo, _, ch, _ = selected(out)
    expect((algo, ch) == ("Tree", 3), f"--plan with the plugin: {algo} on {ch} channel(s)\n{out}")
    expect("Simulated: every rank finished with the exact result" in out, out)
    doc = json.loads(run("--json", "--nranks", "4", *topo("cpu_only.xml"), env=env)[0])
    expect(doc["tuner_plugin"] == f"LoomTestTuner (v4, {plugin})", f"tuner_plugin {doc['tuner_plugin']!r}")
    rows = [r for r in doc["tuning"] if r["collective"] == "AllReduce" and r["bytes"] == 1 << 20]
    expect(len(rows) == 1 and (rows[0]["algorithm"], rows[0]["channels"]) == ("Tree", 3), f"{rows}")
    text, _ = run("--nranks", "4", *topo("cpu_only.xml"), env=env)
    expect(f"tuner plugin: LoomTestTuner (v4, {plugin}) (NCCL_TUNER_PLUGIN)" in text, text)
    out, _ = run("--plan", "allreduce", "1M", "--nranks", "4", *topo("cpu_only.xml"),
                 env={"NCCL_TUNER_PLUGIN": "none"})
    expect("tuner plugin" not in out and selected(out)[0:3:2] != ("Tree", 3), out)
    doc = json.loads(run("--json", "--nranks", "4", *topo("cpu_only.xml"), env={"NCCL_TUNER_PLUGIN": "none"})[0])
    expect(doc["tuner_plugin"] == "", f"tuner_plugin without a plugin: {doc['tuner_plugin']!r}")


def case_plan_hierarchical():
    # Two hosts of two ranks over a socket: large all-reduces go hierarchical, on two
    # channels from 1 MiB, with the half-FIFO chunk.
    out, _ = run("--plan", "allreduce", "4M", "--nodes", "2", "--nranks", "4", "--host-memory",
                 *topo("workstation_2gpu.xml"))
    expect(selected(out) == ("Hierarchical", "Simple", 2, "1M"), f"{selected(out)}\n{out}")
    expect("2 host(s)" in out and "Simulated: every rank finished with the exact result" in out, out)
    expect({c for c, *_ in plan_steps(out)} == {0, 1}, "steps on both channels expected")
    # The FIFO shape a job would use cuts the steps.
    out, _ = run("--plan", "allreduce", "4M", "--nodes", "2", "--nranks", "4", "--host-memory",
                 *topo("workstation_2gpu.xml"), env={"LOOM_SLOT_BYTES": "64K", "LOOM_FIFO_DEPTH": "4"})
    expect("FIFOs 4 x 64K" in out and selected(out)[3] == "128K", out)
    expect(max(b for _, _, b, _, _ in plan_steps(out)) <= 128 << 10, "a step larger than the chunk")


def case_plan_rank_and_root():
    # A chain broadcast from rank 5 of 6: rank 2 relays from 1 to 3; rank 4 only receives.
    out, _ = run("--plan", "broadcast", "4K", "--nranks", "6", "--root", "5", "--rank", "2", *topo("cpu_only.xml"))
    expect("Root: rank 5" in out and "Plan of rank 2" in out, out)
    expect(plan_steps(out) == [(0, "recvCopySend", 4096, 3, 1)], f"{plan_steps(out)}\n{out}")
    out, _ = run("--plan", "broadcast", "4K", "--nranks", "6", "--root", "5", "--rank", "4", *topo("cpu_only.xml"))
    expect(plan_steps(out) == [(0, "recv", 4096, -1, 3)], f"{plan_steps(out)}\n{out}")


def case_plan_forced():
    for algo, name in (("tree", "Tree"), ("ring", "Ring"), ("hd", "HalvingDoubling"), ("direct", "Direct")):
        out, _ = run("--plan", "allreduce", "64K", "--nranks", "3", *topo("cpu_only.xml"), env={"NCCL_ALGO": algo})
        expect(selected(out)[0] == name, f"NCCL_ALGO={algo}: {selected(out)}")
        expect("with the exact result" in out, out)
    # GPU memory: protocols are the selector's too.
    out, _ = run("--plan", "allreduce", "1G", *topo("dgx_h100.xml"), env={"NCCL_PROTO": "LL"})
    expect(selected(out)[1] == "LL", f"{selected(out)}")
    out, _ = run("--plan", "allreduce", "1G", *topo("dgx_h100.xml"))
    algo, proto, ch, _ = selected(out)
    expect((algo, proto, ch) == ("Ring", "Simple", 16), f"{selected(out)}")
    expect("sizes and order only" in out, out)  # too large to hold the data


def case_plan_errors():
    _, err = run("--plan", "alltoall", "1K", *topo("cpu_only.xml"), rc=1)
    expect("not a collective loom-topo can plan" in err, err)
    _, err = run("--plan", "allreduce", *topo("cpu_only.xml"), rc=2)
    expect("--plan takes a collective and a size" in err, err)
    _, err = run("--plan", "allreduce", "1K", "--nranks", "2", "--rank", "2", *topo("cpu_only.xml"), rc=1)
    expect("--rank 2" in err, err)
    _, err = run("--plan", "allreduce", "lots", *topo("cpu_only.xml"), rc=1)
    expect("lots" in err, err)
    _, err = run("--plan", "allreduce", "1K", "--json", *topo("cpu_only.xml"), rc=2)
    expect("--json" in err, err)


def case_table_follows_selector():
    # The table is the selector's: NCCL_ALGO forces it, and a restriction nothing can
    # satisfy is an error row naming what a job would run instead.
    out, _ = run("--json", "--nranks", "4", *topo("cpu_only.xml"), env={"NCCL_ALGO": "allreduce:tree"})
    rows = json.loads(out)["tuning"]
    expect(all(r["algorithm"] == "Tree" for r in rows if r["collective"] == "AllReduce"), "tree not forced")
    out, _ = run("--json", "--nranks", "4", *topo("cpu_only.xml"), env={"NCCL_ALGO": "tree"})
    ag = [r for r in json.loads(out)["tuning"] if r["collective"] == "AllGather"]
    expect(ag and all(r["algorithm"] is None and "Ring/Simple instead" in r["error"] for r in ag), f"{ag[:2]}")
    a2a = [r for r in json.loads(out)["tuning"] if r["collective"] == "AlltoAll"]
    expect(all(r["algorithm"] == "Direct" for r in a2a), "NCCL_ALGO does not govern AlltoAll")


def case_net_rails():
    """Which NIC each local rank's channels use across hosts (the net transport's rails):
    on an 8-GPU, 8-NIC host local rank o keeps NIC o for every channel (its GPU's rail); two
    ranks of a host with two NICs get one each."""
    out, _ = run("--nodes", "2", *topo("dgx_h100.xml"))
    for o in range(8):
        m = re.search(rf"^    local rank {o}: (.*)$", out, re.M)
        expect(m, f"no rails line for local rank {o} in\n{out}")
        nics = re.findall(r"channel \d+ -> NIC(\d+) (\S+?)(?:,|$)", m.group(1))
        expect(nics and all(n == (str(o), f"mlx5_{o}") for n in nics),
               f"local rank {o} should use NIC{o} mlx5_{o} on every channel: {m.group(1)}")
    js = json.loads(run("--nodes", "2", "--json", *topo("dgx_h100.xml"))[0])
    expect([r["channel_nics"][0] for r in js["net_rails"]] == list(range(8)),
           f"net_rails: {js['net_rails']}")
    # The device executor starts each rank at its GPU's rail: GPU 0 beside NIC "loomtest-lo1"
    # (the topology's second NIC) starts there, where local rank 0 starts on the first.
    out, _ = run("--nodes", "2", *topo("rails_2gpu_2nic.xml"))
    m = re.search(r"^    GPU0: channel 0 -> NIC(\d+) (\S+?)(?:,|$)", out, re.M)
    expect(m and m.group(2) == "loomtest-lo1", f"GPU0 should start on loomtest-lo1:\n{out}")
    m = re.search(r"^    local rank 0: channel 0 -> NIC(\d+) (\S+?)(?:,|$)", out, re.M)
    expect(m and m.group(2) != "loomtest-lo1", f"local rank 0 should not start on GPU0's NIC:\n{out}")
    # Host memory, two ranks per host, two NICs: one each.
    out, _ = run("--nodes", "2", "--nranks", "4", "--host-memory", *topo("cpu_only.xml"))
    for o in range(2):
        m = re.search(rf"^    local rank {o}: channel 0 -> NIC(\d+)", out, re.M)
        expect(m and int(m.group(1)) == o, f"local rank {o} should start on NIC{o}:\n{out}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
if CASE not in CASES:
    fail(f"unknown case {CASE}; cases: {sorted(CASES)}")
CASES[CASE]()
print("PASS", CASE)
