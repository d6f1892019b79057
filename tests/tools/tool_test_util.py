"""What the command-line tool tests share: running a tool in a scrubbed environment (no
LOOM_*/NCCL_* from the caller) and failing with its output."""
import os
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def run_tool(binary, args, env=None, rc=None, timeout=60, preexec=None):
    """Runs binary with args and only `env` of Loom's and NCCL's variables; fails the test
    unless it exits `rc` (None: any). Returns the CompletedProcess."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "NCCL_"))}
    clean.update(env or {})
    p = subprocess.run([binary, *args], env=clean, capture_output=True, text=True,
                       timeout=timeout, preexec_fn=preexec)
    if rc is not None and p.returncode != rc:
        fail(f"{os.path.basename(binary)} {' '.join(args)} with {env}: exit {p.returncode}, "
             f"expected {rc}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p
