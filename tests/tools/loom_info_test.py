#!/usr/bin/env python3
"""Checks loom-info's output end to end by running the binary.

usage: loom_info_test.py <loom-info> <source dir> <loom version> <case>

Each case runs loom-info in a scrubbed environment (no LOOM_* / NCCL_* variables but the
ones the case sets) and fails with a message naming what differed.
"""
import json
import os
import re
import subprocess
import sys

from tool_test_util import expect, fail, run_tool  # noqa: F401

BIN, SRC, VERSION, CASE = sys.argv[1:5]


def run(*args, env=None, rc=0):
    p = run_tool(BIN, args, env=env, rc=rc, timeout=60)
    return p.stdout, p.stderr


def knob_row(text, name):
    """The table row of a knob, split into columns (NAME, ALIAS, VALUE..., SOURCE...)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return line
    fail(f"no table row for {name}")


def declared_knobs():
    """Every LOOM_* knob declared in the sources that make up libloom (the layer globs of
    the top-level CMakeLists.txt, tests excluded)."""
    dirs = ["src/base", "kernels", "src/bootstrap", "transports", "src/topo", "src/algo",
            "src/engine", "src/api"]
    pat = re.compile(r'\b(?:Int|Bool|String|Size)Knob\s+\w+\s*\(\s*"(LOOM_\w+)"')
    names = set()
    for d in dirs:
        root = os.path.join(SRC, d)
        if not os.path.isdir(root):
            continue
        depth = 1 if d == "transports" else 0  # transports/*.cc and transports/*/*.cc
        for cur, subdirs, files in os.walk(root):
            if cur[len(root):].count(os.sep) >= depth:
                subdirs[:] = []
            for f in files:
                if f.endswith(".cc") and not f.endswith("_test.cc"):
                    with open(os.path.join(cur, f), encoding="utf-8") as fh:
                        names.update(pat.findall(fh.read()))
    return names


def case_text():
    out, _ = run()
    expect(out.startswith(f"Loom {VERSION} (implements the NCCL 2.28.9 API)"),
           f"first line: {out.splitlines()[0]!r}")
    expect(re.search(r"^  host memory +compiled: yes +runtime: found", out, re.M),
           "no 'host memory  compiled: yes  runtime: found' line")
    for feature in ["CUDA", "NVML", "ibverbs", "UCX", "NCCL fallback"]:
        expect(re.search(rf"^  {feature} +compiled: (yes|no) +runtime: (found /|not found)", out, re.M),
               f"no feature line for {feature}")
    # Where a stock NCCL is found, what it serves beside the collectives (this machine's
    # CUDA toolkit has NCCL 2.28.9: windows and the device API, no 2.29 lookups).
    fb = re.search(r"^  NCCL fallback .*runtime: found .*\(NCCL ([0-9.]+);.*beside the collectives: "
                   r"registration (yes|no), windows (yes|no), device API (yes|no), window lookups "
                   r"\(NCCL 2.29\+\) (yes|no), puts and signals \(NCCL 2.29\+\) (yes|no), "
                   r"memory statistics and suspension \(NCCL 2.29\+\) (yes|no), "
                   r"ncclMemAlloc (yes|no)\)$", out, re.M)
    if "NCCL fallback     compiled: yes  runtime: found" in out:
        expect(fb, "the fallback's line does not say what stock NCCL serves beside collectives")
        if fb and fb.group(1) == "2.28.9":
            expect(fb.groups()[1:] == ("yes", "yes", "yes", "no", "no", "no", "yes"), f"NCCL 2.28.9: {fb.groups()}")
    expect(re.search(r"CPU reduction ISA: (generic|avx2|avx512) ", out), "no CPU ISA line")
    expect(re.search(r"^  bootstrap interface: \S+ \S+$", out, re.M), "no bootstrap interface")
    expect(re.search(r"^  host: \S+  id: \S+  hash: 0x[0-9a-f]{16}$", out, re.M), "no host line")
    row = knob_row(out, "LOOM_SLOT_BYTES").split()
    expect(row[1] == "-" and row[-1] == "default", f"LOOM_SLOT_BYTES row {row}")
    row = knob_row(out, "LOOM_DEBUG").split()
    expect(row[1] == "NCCL_DEBUG" and row[2] == '""' and row[3] == "default",
           f"LOOM_DEBUG row {row}")
    names = [l.split()[0] for l in out.split("\nKnobs")[1].splitlines()[2:]
             if l and not l.startswith(" ")]
    expect(names == sorted(names) and len(names) == len(set(names)), f"knobs not sorted/unique: {names}")


def case_env():
    out, _ = run(env={"NCCL_DEBUG": "INFO"})
    row = knob_row(out, "LOOM_DEBUG")
    expect(re.match(r"LOOM_DEBUG +NCCL_DEBUG +INFO +env NCCL_DEBUG \(default \"\"\)$", row),
           f"NCCL_DEBUG=INFO row: {row!r}")
    # The Loom name wins over the NCCL alias when both are set.
    out, _ = run(env={"NCCL_DEBUG": "INFO", "LOOM_DEBUG": "WARN"})
    row = knob_row(out, "LOOM_DEBUG").split()
    expect(row[2] == "WARN" and row[3:5] == ["env", "LOOM_DEBUG"], f"LOOM_DEBUG=WARN row {row}")
    out, _ = run(env={"LOOM_SLOT_BYTES": "1M"})
    row = knob_row(out, "LOOM_SLOT_BYTES").split()
    expect(row[2] == "1M" and row[3:5] == ["env", "LOOM_SLOT_BYTES"], f"LOOM_SLOT_BYTES row {row}")


def knobs_by_name(doc):
    return {k["name"]: k for k in doc["knobs"]}


def case_json():
    out, _ = run("--json", env={"NCCL_DEBUG": "INFO", "LOOM_SLOT_BYTES": "1M"})
    doc = json.loads(out)
    expect(doc["version"] == VERSION and doc["ncclVersion"] == "2.28.9" and
           doc["ncclVersionCode"] == 22809, f"versions {doc['version']} {doc['ncclVersion']}")
    feats = {f["key"]: f for f in doc["features"]}
    expect(sorted(feats) == sorted(["hostMemory", "cuda", "nvml", "ibverbs", "ucx", "ncclFallback",
                                    "netPlugins", "tunerPlugin", "profilerPlugin"]),
           f"feature keys {sorted(feats)}")
    expect(feats["hostMemory"]["compiled"] and feats["hostMemory"]["available"], "host memory")
    for f in doc["features"]:
        if f["key"] != "hostMemory" and f["available"]:
            expect(f["path"].startswith("/"), f"{f['name']} found but no path: {f}")
    expect(doc["cpuIsa"] in doc["cpuIsasSupported"], "active ISA not among the supported ones")
    knobs = knobs_by_name(doc)
    expect(len(knobs) == len(doc["knobs"]), "duplicate knob names")
    for k in doc["knobs"]:
        expect(set(k) >= {"name", "alias", "type", "default", "value", "source", "help", "valid"},
               f"knob entry lacks fields: {k}")
        expect(k["type"] in ("int", "bool", "string", "size") and k["help"], f"knob {k}")
        if k["source"] == "default":
            expect(k["value"] == k["default"], f"{k['name']}: default source, value != default")
    expect([k["name"] for k in doc["knobs"]] == sorted(knobs), "knobs not sorted by name")
    d = knobs["LOOM_DEBUG"]
    expect(d["alias"] == "NCCL_DEBUG" and d["value"] == "INFO" and d["source"] == "env NCCL_DEBUG",
           f"LOOM_DEBUG {d}")
    s = knobs["LOOM_SLOT_BYTES"]
    expect(s["type"] == "size" and s["value"] == "1M" and s["valid"], f"LOOM_SLOT_BYTES {s}")
    # The text table and the JSON list the same knobs.
    text, _ = run()
    for name in knobs:
        knob_row(text, name)


def case_registry():
    """Every knob declared in the library's sources is registered in the binary (the tool
    links loom_internal whole, so knobs in otherwise unreferenced objects are there too)."""
    out, _ = run("--json")
    listed = set(knobs_by_name(json.loads(out)))
    declared = declared_knobs()
    expect(len(declared) >= 10, f"source scan found only {sorted(declared)}")
    missing = declared - listed
    expect(not missing, f"declared in the sources but not listed by loom-info: {sorted(missing)}")


def case_knob():
    out, _ = run("--knob", "NCCL_SOCKET_IFNAME", env={"NCCL_SOCKET_IFNAME": "=lo"})
    lines = out.splitlines()
    expect(lines[0] == "LOOM_SOCKET_IFNAME", f"header {lines[0]!r}")
    expect("  NCCL alias: NCCL_SOCKET_IFNAME" in lines, out)
    expect("  value:      =lo" in lines and "  source:     env NCCL_SOCKET_IFNAME" in lines, out)
    out, _ = run("--knob", "loom_socket_ifname", "--json")
    k = json.loads(out)
    expect(k["name"] == "LOOM_SOCKET_IFNAME" and k["source"] == "default", f"{k}")
    _, err = run("--knob", "IFNAME", rc=2)
    expect("no knob named 'IFNAME'" in err and "LOOM_SOCKET_IFNAME" in err, err)
    run("--knob", rc=2)
    run("--bogus", rc=2)
    out, _ = run("--help")
    expect(out.startswith("usage: loom-info"), out)


def case_invalid():
    out, _ = run(env={"LOOM_FIFO_DEPTH": "abc", "NCCL_SHM_DISABLE": "maybe"}, rc=1)
    row = knob_row(out, "LOOM_FIFO_DEPTH")
    expect(re.match(r"LOOM_FIFO_DEPTH +- +abc \(INVALID\) +env LOOM_FIFO_DEPTH", row), row)
    expect("    error: LOOM_FIFO_DEPTH=abc is not an integer" in out, out)
    # A malformed alias is reported under the variable the user actually set.
    expect(re.search(r"error: NCCL_SHM_DISABLE=maybe is not a boolean", out), out)
    expect("2 knobs have a malformed value" in out, out)
    out, _ = run("--json", env={"LOOM_FIFO_DEPTH": "abc"}, rc=1)
    doc = json.loads(out)
    k = knobs_by_name(doc)["LOOM_FIFO_DEPTH"]
    expect(not k["valid"] and k["value"] == "abc" and "not an integer" in k["error"], f"{k}")
    expect(doc["invalidKnobs"] == 1, f"invalidKnobs {doc['invalidKnobs']}")
    out, _ = run("--knob", "LOOM_FIFO_DEPTH", env={"LOOM_FIFO_DEPTH": "abc"}, rc=1)
    expect("  value:      abc (INVALID)" in out.splitlines(), out)


def case_network():
    out, _ = run(env={"NCCL_SOCKET_IFNAME": "=lo", "NCCL_SOCKET_FAMILY": "AF_INET"})
    expect(re.search(r"^  bootstrap interface: lo 127\.0\.0\.1$", out, re.M), out)
    # No matching interface: reported with the bootstrap's own message, not a crash.
    out, _ = run(env={"NCCL_SOCKET_IFNAME": "=nosuchif0"})
    expect(re.search(r"^  bootstrap interface: none: NCCL_SOCKET_IFNAME='=nosuchif0' matches no",
                     out, re.M), out)
    out, _ = run("--json", env={"NCCL_SOCKET_IFNAME": "=nosuchif0"})
    net = json.loads(out)["network"]
    expect(net["bootstrapInterface"] is None and "nosuchif0" in net["bootstrapError"], f"{net}")
    expect(any(i["name"] == "lo" for i in net["interfaces"]), f"{net}")
    out, _ = run(env={"LOOM_HOSTID": "pretend-host-7"})
    expect(re.search(r"  id: pretend-host-7  hash", out), "LOOM_HOSTID not shown as the host id")


def case_net_plugins():
    """NCCL_NET_PLUGIN as loom-info reports it: the plugin loaded with its ABI version and
    path, entries that did not load with the names tried; none: nothing."""
    plugin = os.environ["LOOM_TEST_NET_PLUGIN"]
    out, _ = run("--json", env={"NCCL_NET_PLUGIN": plugin + ",no-such-plugin"})
    f = {x["key"]: x for x in json.loads(out)["features"]}["netPlugins"]
    expect(f["available"] and f["path"] == plugin, f"netPlugins {f}")
    expect("LoomTest (v11, " + plugin in f["detail"] and "libnccl-net-no-such-plugin.so" in f["detail"],
           f"netPlugins detail {f['detail']}")
    out, _ = run("--json", env={"NCCL_NET_PLUGIN": "none"})
    f = {x["key"]: x for x in json.loads(out)["features"]}["netPlugins"]
    expect(not f["available"] and "none" in f["detail"], f"netPlugins with none: {f}")


def case_tuner_plugin():
    """NCCL_TUNER_PLUGIN as loom-info reports it: the plugin with its ABI version and path;
    a name that does not load, or none: nothing, saying so."""
    plugin = os.environ["LOOM_TEST_TUNER_PLUGIN"]
    out, _ = run("--json", env={"NCCL_TUNER_PLUGIN": plugin})
    f = {x["key"]: x for x in json.loads(out)["features"]}["tunerPlugin"]
    expect(f["available"] and f["path"] == plugin and f["detail"] == f"LoomTestTuner (v4, {plugin})",
           f"tunerPlugin {f}")
    for spec, says in (("none", "NCCL_TUNER_PLUGIN=none"), ("no-such-tuner", "no-such-tuner does not load")):
        out, _ = run("--json", env={"NCCL_TUNER_PLUGIN": spec, "NCCL_NET_PLUGIN": "none"})
        f = {x["key"]: x for x in json.loads(out)["features"]}["tunerPlugin"]
        expect(not f["available"] and says in f["detail"], f"tunerPlugin with {spec}: {f}")


def case_profiler_plugin():
    """NCCL_PROFILER_PLUGIN as loom-info reports it: the plugin with its ABI version and path;
    a name that does not load, or none: nothing, saying so."""
    plugin = os.environ["LOOM_TEST_PROFILER_PLUGIN"]
    out, _ = run("--json", env={"NCCL_PROFILER_PLUGIN": plugin})
    f = {x["key"]: x for x in json.loads(out)["features"]}["profilerPlugin"]
    expect(f["available"] and f["path"] == plugin and f["detail"] == f"loomtest-v5 (v5, {plugin})",
           f"profilerPlugin {f}")
    for spec, says in (("none", "NCCL_PROFILER_PLUGIN=none"), ("no-such-profiler", "no-such-profiler does not load"),
                       (None, "libnccl-profiler.so does not load")):
        env = {"NCCL_NET_PLUGIN": "none"}
        if spec:
            env["NCCL_PROFILER_PLUGIN"] = spec
        out, _ = run("--json", env=env)
        f = {x["key"]: x for x in json.loads(out)["features"]}["profilerPlugin"]
        expect(not f["available"] and says in f["detail"], f"profilerPlugin with {spec}: {f}")


def case_logs_off_stdout():
    # The library logs to stdout by default; loom-info must keep its report parseable.
    out, err = run("--json", env={"NCCL_DEBUG": "WARN", "LOOM_CPU_ISA": "bogus"})
    json.loads(out)
    expect("LOOM_CPU_ISA=bogus" in err, f"the WARN should reach stderr; stderr: {err!r}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
if CASE not in CASES:
    fail(f"unknown case {CASE}; cases: {sorted(CASES)}")
CASES[CASE]()
print("PASS", CASE)
