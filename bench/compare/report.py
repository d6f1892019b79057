"""Aggregates compare.py's samples into medians, ratio tables, CSV, JSON and markdown."""

import csv
import json
import statistics

import runners

LIB_NAMES = {"loom": "Loom", "mpi": "Open MPI", "gloo": "Gloo", "before": "Loom before"}
OP_NAMES = {"allreduce": "all-reduce", "allgather": "all-gather",
            "reducescatter": "reduce-scatter"}
MIB = 1 << 20

# Targets: (op, library compared against, minimum ratio Loom/library, sizes it applies to).
# Issue 4 (2 ranks): bandwidth against Open MPI and Gloo. Issue 10: never more than 5%
# slower than the build before the engine redesign (--before-bin), small all-reduces
# within 1.5x of Open MPI, and with more ranks than cores within 2x of Open MPI.
def ratio_targets(op, nranks=2, cores=None):
    cores = cores or runners.os.cpu_count() or 1
    before = [("before", 0.95, lambda s: True)]
    if nranks > cores:
        return [("mpi", 0.5, lambda s: True)] + before
    if op == "allreduce":
        return [("mpi", 2.0, lambda s: s in (2 * MIB, 8 * MIB, 32 * MIB, 128 * MIB)),
                ("mpi", 1 / 1.5, lambda s: s <= 1024),
                ("gloo", 3.0, lambda s: s >= MIB)] + before
    return [("mpi", 1.5, lambda s: s >= MIB)] + before


LATENCY_TARGET_US = 3.0


def fmt_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def aggregate(samples):
    """{(op, size, library, variant): summary} with medians over rounds."""
    groups = {}
    for s in samples:
        groups.setdefault((s.op, s.size, s.library, s.variant), []).append(s)
    out = {}
    for key, group in groups.items():
        times = [g.time_us for g in group]
        bws = [g.busbw for g in group]
        out[key] = {
            "op": key[0], "size": key[1], "library": key[2], "variant": key[3],
            "rounds": len(group),
            "time_us": statistics.median(times), "busbw": statistics.median(bws),
            "time_us_min": min(times), "time_us_max": max(times),
            "busbw_min": min(bws), "busbw_max": max(bws),
            "wrong": sum(g.wrong for g in group),
            "samples_time_us": times, "samples_busbw": bws,
        }
    return out


def _get(agg, op, size, lib, variant):
    return agg.get((op, size, lib, variant))


def ratio_rows(agg, op, libs):
    """Per size: Loom busbw (oop, ip), each other library's busbw and Loom's ratio to it."""
    sizes = sorted({k[1] for k in agg if k[0] == op})
    rows = []
    for size in sizes:
        loom_oop = _get(agg, op, size, "loom", "oop")
        loom_ip = _get(agg, op, size, "loom", "ip")
        row = {"size": size,
               "loom_oop_busbw": loom_oop and loom_oop["busbw"],
               "loom_ip_busbw": loom_ip and loom_ip["busbw"],
               "loom_oop_time_us": loom_oop and loom_oop["time_us"],
               "loom_ip_time_us": loom_ip and loom_ip["time_us"]}
        for lib in libs:
            if lib == "loom":
                continue
            variant = runners.reference_variant(lib)
            ref = _get(agg, op, size, lib, variant)
            mine = _get(agg, op, size, "loom", variant)
            row[f"{lib}_busbw"] = ref and ref["busbw"]
            row[f"{lib}_time_us"] = ref and ref["time_us"]
            # Same bytes and factor, so the busbw ratio is the inverse time ratio (exact
            # even where a printed busbw rounds to 0.00).
            row[f"loom_over_{lib}"] = (ref["time_us"] / mine["time_us"]
                                       if mine and ref and mine["time_us"] > 0 else None)
        rows.append(row)
    return rows


def target_checks(agg, ops, libs, nranks=2):
    """The targets' figures, each with the measured value and pass/fail."""
    checks = []
    for op in ops:
        rows = ratio_rows(agg, op, libs)
        for lib, minimum, applies in ratio_targets(op, nranks):
            if lib not in libs:
                continue
            for row in rows:
                ratio = row.get(f"loom_over_{lib}")
                if applies(row["size"]) and ratio is not None:
                    checks.append({"what": f"{OP_NAMES[op]} {fmt_size(row['size'])} busbw "
                                           f"Loom/{LIB_NAMES[lib]} >= {minimum:g}x",
                                   "measured": round(ratio, 2), "pass": ratio >= minimum})
        if op == "allreduce" and nranks <= (runners.os.cpu_count() or 1):
            small = min((r for r in rows), key=lambda r: r["size"], default=None)
            if small and small["size"] == 8 and small["loom_oop_time_us"] is not None:
                t = small["loom_oop_time_us"]
                checks.append({"what": f"all-reduce 8 B latency <= {LATENCY_TARGET_US:g} us",
                               "measured": round(t, 2), "pass": t <= LATENCY_TARGET_US})
    return checks


def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown_tables(agg, ops, libs):
    lines = []
    for op in ops:
        rows = ratio_rows(agg, op, libs)
        if not rows:
            continue
        others = [l for l in libs if l != "loom" and any(r.get(f"{l}_busbw") for r in rows)]
        lines.append(f"#### {OP_NAMES[op]}: bus bandwidth (GB/s), medians\n")
        head = ["size", "Loom", "Loom in-place"] + [LIB_NAMES[l] for l in others] + \
               [f"Loom/{LIB_NAMES[l]}" for l in others]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---:|" * len(head))
        for r in rows:
            cells = [fmt_size(r["size"]), _f(r["loom_oop_busbw"]), _f(r["loom_ip_busbw"])]
            cells += [_f(r.get(f"{l}_busbw")) for l in others]
            cells += [_f(r.get(f"loom_over_{l}")) + ("x" if r.get(f"loom_over_{l}") is not None
                                                     else "") for l in others]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        small = rows[0]
        lat = [f"Loom {_f(small['loom_oop_time_us'])} us"]
        lat += [f"{LIB_NAMES[l]} {_f(small.get(f'{l}_time_us'))} us" for l in others]
        lines.append(f"{OP_NAMES[op]} time at {fmt_size(small['size'])}: " + ", ".join(lat) + "\n")
    return "\n".join(lines)


def markdown_checks(checks):
    lines = ["| target | measured | met |", "|---|---:|:---:|"]
    for c in checks:
        lines.append(f"| {c['what']} | {c['measured']} | {'yes' if c['pass'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def write_csv(path, agg):
    fields = ["op", "size", "library", "variant", "rounds", "time_us", "busbw",
              "time_us_min", "time_us_max", "busbw_min", "busbw_max", "wrong"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for key in sorted(agg, key=lambda k: (k[0], k[1], k[2], k[3])):
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v)
                        for k, v in agg[key].items()})


def write_json(path, meta, agg, ops, libs, checks, samples):
    doc = {
        "meta": meta,
        "results": [agg[k] for k in sorted(agg)],
        "ratios": {op: ratio_rows(agg, op, libs) for op in ops},
        "targets": checks,
        "raw_samples": [vars(s) for s in samples],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
