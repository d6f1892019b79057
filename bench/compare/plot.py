"""Plots compare.py's JSON: bus bandwidth against message size, one line per library,
log-log, one PNG per collective (<out_dir>/<op>_busbw.png).

Run by compare.py with an interpreter that has matplotlib (it may differ from the one
running compare.py); usable alone: python3 plot.py results.json out_dir
"""

import json
import sys

STYLES = {  # (library, variant) -> label, line style
    ("loom", "oop"): ("Loom", dict(color="tab:blue", marker="o", linestyle="-")),
    ("loom", "ip"): ("Loom (in place)", dict(color="tab:blue", marker=".", linestyle=":")),
    ("mpi", "oop"): ("Open MPI", dict(color="tab:orange", marker="s", linestyle="-")),
    ("gloo", "ip"): ("PyTorch Gloo", dict(color="tab:green", marker="^", linestyle="-")),
}
OP_TITLES = {"allreduce": "all-reduce (float sum)", "allgather": "all-gather",
             "reducescatter": "reduce-scatter (float sum)"}


def size_label(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return str(n)


def plot(doc, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = doc["meta"]
    written = []
    for op in meta["ops"]:
        fig, ax = plt.subplots(figsize=(8, 5))
        sizes_seen = set()
        for (lib, variant), (label, style) in STYLES.items():
            pts = sorted((r["size"], r["busbw"]) for r in doc["results"]
                         if r["op"] == op and r["library"] == lib and r["variant"] == variant
                         and r["busbw"] > 0)
            if not pts:
                continue
            sizes_seen.update(p[0] for p in pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        if not sizes_seen:
            plt.close(fig)
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted(sizes_seen)
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) for t in ticks], rotation=45)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s, nccl-tests formula)")
        ax.set_title(f"{OP_TITLES.get(op, op)}, {meta['nranks']} ranks on one host, "
                     f"median of {meta['rounds']} rounds\n{meta['machine']['cpu']}, "
                     f"{meta['machine']['cores']} cores, {meta['date'][:10]}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = f"{out_dir}/{op}_busbw.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv):
    if len(argv) != 3:
        print("usage: plot.py results.json out_dir", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        doc = json.load(f)
    for path in plot(doc, argv[2]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
