"""A real network for test worlds: each rank in its own network namespace, joined to a bridge
by a veth pair, so a rank's link can be slowed with a traffic-control rate limit (tbf).
Needs root, `ip` and `tc`, and kernel support for namespaces, veth, bridges and tbf;
`available()` says whether this machine has them. netem (a plain added delay) would be the
natural choice, but kernels without sch_netem (this VM's) refuse it; tbf is a link slowed
for real: every byte the rank sends goes through it.

Everything created is named with a per-process tag and removed by `Network.close()`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

CLONE_NEWNET = 0x40000000


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


class Network:
    def __init__(self, ranks: int, tag: str) -> None:
        self.ranks, self.tag = ranks, tag
        self.bridge = f"lm{tag}br"
        try:
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh("ip", "link", "set", self.bridge, "up")
            for r in range(ranks):
                ns, inner, outer = self.namespace(r), self.interface(r), f"lm{tag}{r}b"
                _sh("ip", "netns", "add", ns)
                _sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
                _sh("ip", "link", "set", inner, "netns", ns)
                _sh("ip", "link", "set", outer, "master", self.bridge)
                _sh("ip", "link", "set", outer, "up")
                _sh("ip", "-n", ns, "addr", "add", f"10.77.{int(tag, 16) % 250}.{10 + r}/24", "dev", inner)
                _sh("ip", "-n", ns, "link", "set", inner, "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def namespace(self, rank: int) -> str:
        return f"lm{self.tag}ns{rank}"

    def interface(self, rank: int) -> str:
        return f"lm{self.tag}{rank}i"

    def close(self) -> None:
        for r in range(self.ranks):
            subprocess.run(["ip", "netns", "del", self.namespace(r)], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


def join(namespace: str, interface: str) -> None:
    """Moves this process into `namespace` and points gloo at `interface` (call before the
    process group exists)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = interface


def limit(interface: str, rate: str) -> None:
    """Rate-limits what this namespace sends through `interface`."""
    _sh("tc", "qdisc", "add", "dev", interface, "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")


def unlimit(interface: str) -> None:
    _sh("tc", "qdisc", "del", "dev", interface, "root")


def available() -> str:
    """Empty when this machine can build such a network, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs ip and tc (iproute2)"
    tag = f"{os.getpid() % 0xFFF:03x}"
    try:
        net = Network(1, tag)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot build namespaces, veth and a bridge: {getattr(e, 'stderr', '') or e}"
    try:
        _sh("ip", "netns", "exec", net.namespace(0), "tc", "qdisc", "add", "dev", net.interface(0), "root", "tbf",
            "rate", "20mbit", "burst", "32kbit", "latency", "400ms")
    except (subprocess.CalledProcessError, OSError) as e:
        return f"no tbf qdisc: {getattr(e, 'stderr', '') or e}"
    finally:
        net.close()
    return ""
