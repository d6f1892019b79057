"""A switched network of Linux network namespaces: one namespace per emulated host, each
with a veth interface `mh0` (10.213.0.<k+1>/24) plugged into a bridge that lives in a
switch namespace of its own. Nothing is created in the caller's namespace, so runs never
touch the machine's own network and parallel runs (their names carry the creating pid)
never collide, even though all use the same addresses.

Cleanup is layered so that no run leaves namespaces behind:
  1. Fabric is a context manager, and SIGTERM/SIGINT/SIGHUP become exceptions;
  2. a reaper process in its own session waits for the creator to die (its stdin pipe
     closes even on SIGKILL, e.g. a CTest timeout) and then removes what is left;
  3. every new Fabric first removes namespaces of earlier creators that are dead.
"""
import os
import re
import shutil
import signal
import subprocess
import sys

PREFIX = "lmh"
IFNAME = "mh0"
SUBNET = "10.213.0"
_NAME = re.compile(r"^%s(\d+)-" % PREFIX)


class NetnsUnavailable(Exception):
    pass


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), (r.stderr or r.stdout).strip()))
    return r.stdout


def _namespaces():
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove(names):
    """Kills whatever still runs in `names`, then deletes them (veths go with them)."""
    for ns in names:
        for pid in _ip("netns", "pids", ns, check=False).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        _ip("netns", "del", ns, check=False)


def sweep_orphans():
    """Removes namespaces whose creating process no longer exists."""
    dead = [ns for ns in _namespaces() if _NAME.match(ns) and not _alive(int(_NAME.match(ns).group(1)))]
    remove(dead)
    return dead


def reap(prefix):
    """The reaper's body: block until the creator's pipe closes, then clean up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    remove([ns for ns in _namespaces() if ns.startswith(prefix)])


class Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise Terminated("killed by signal %d" % signum)


def check_available():
    """Raises NetnsUnavailable, saying why, when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("not running as root (euid %d): network namespaces need "
                               "CAP_SYS_ADMIN" % os.geteuid())
    if not shutil.which("ip"):
        raise NetnsUnavailable("'ip' (iproute2) is not installed")


class Fabric:
    """`with Fabric(3) as f:` gives namespaces f.hosts[0..2] at f.address(k)."""

    def __init__(self, nhosts, rate=None):
        self.nhosts = nhosts
        self.rate = rate  # e.g. "10gbit": tbf on both ends of every link
        self.prefix = "%s%d-" % (PREFIX, os.getpid())
        self.switch = self.prefix + "sw"
        self.hosts = [self.prefix + str(k) for k in range(nhosts)]
        self._reaper = None

    @staticmethod
    def address(k):
        return "%s.%d" % (SUBNET, k + 1)

    def __enter__(self):
        check_available()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _raise_terminated)
        sweep_orphans()
        self._reaper = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--reap", self.prefix],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            self._build()
        except Exception as e:
            self.__exit__(None, None, None)
            if isinstance(e, RuntimeError):
                raise NetnsUnavailable(str(e)) from e
            raise
        return self

    def _build(self):
        sw = self.switch
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "set", "lo", "up")
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for k, ns in enumerate(self.hosts):
            _ip("netns", "add", ns)
            port = "p%d" % k
            # Created inside the switch namespace, the peer end straight in the host's:
            # neither ever appears in the caller's namespace.
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
            _ip("-n", sw, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", "%s/24" % self.address(k), "dev", IFNAME)
            _ip("-n", ns, "link", "set", IFNAME, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.rate:
                for where, dev in ((ns, IFNAME), (sw, port)):
                    subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev,
                                    "root", "tbf", "rate", self.rate, "burst", "1mb",
                                    "latency", "50ms"], check=True, capture_output=True, timeout=30)

    def exec_prefix(self, k):
        return ["ip", "netns", "exec", self.hosts[k]]

    def __exit__(self, *exc):
        remove(self.hosts + [self.switch])
        if self._reaper:
            self._reaper.stdin.close()  # the reaper finds nothing left and exits
            self._reaper = None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        return False


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--reap":
        reap(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "--sweep":
        print("removed:", " ".join(sweep_orphans()) or "nothing")
    else:
        sys.exit("usage: fabric.py --sweep | --reap <prefix>")
