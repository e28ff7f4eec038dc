"""The testbed's private network: one Linux network namespace per Kafka node, on a bridge (SPEC §12).

Each node (the controller, every broker) lives in its own namespace with one address 10.<a>.<b>.<10+i> on a
veth pair whose other end is plugged into a bridge in the root namespace; the bridge holds .1, so the
producer, the consumer and the sampler (root namespace) reach every node, and nothing listens anywhere else.

Isolation (SPEC §2.2 `isolate`: the broker cannot reach its peers nor the controller, clients still reach it)
is a pair of blackhole routes per peer: in the isolated node's namespace towards each peer, and in each peer's
namespace towards it. The root namespace's route stays, so clients keep talking to the isolated broker.
`heal` deletes the routes. Everything is removed on exit, including after a failure or Ctrl-C.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from dataclasses import dataclass, field

from testbed.jars import TestbedUnavailable


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _ip("-4", "-o", "addr", "show").stdout
    nets = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return nets


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.77-10.99.x.0 that no interface of this machine uses (several testbeds may run at once)."""
    used = _used_networks()
    start = os.getpid() % 250
    for a in range(77, 100):
        for k in range(250):
            net = ipaddress.ip_network(f"10.{a}.{(start + k) % 250}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
    raise TestbedUnavailable("no free 10.x.y.0/24 subnet for the testbed's network")


@dataclass
class Node:
    name: str  # "controller" or "broker-<id>"
    netns: str
    address: str
    host_veth: str


@dataclass
class Network:
    """Namespaces, veths and the bridge of one testbed run; a context manager that always removes them."""

    tag: str  # short, unique per run: names the bridge, the namespaces and the veths
    node_names: list[str]
    nodes: dict[str, Node] = field(default_factory=dict)
    bridge: str = ""
    subnet: ipaddress.IPv4Network | None = None
    _blackholes: set[tuple[str, str]] = field(default_factory=set)  # (netns, address)

    def __enter__(self) -> Network:
        if os.geteuid() != 0:
            raise TestbedUnavailable("the testbed makes network namespaces for its brokers and needs root "
                                     "(ip netns add)")
        try:
            _ip("netns", "list")
        except (OSError, subprocess.CalledProcessError) as exc:
            raise TestbedUnavailable(f"network namespaces are unavailable here (ip netns: {exc})") from exc
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        self.subnet = free_subnet()
        hosts = list(self.subnet.hosts())
        self.bridge = f"rlb{self.tag}"
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
        except subprocess.CalledProcessError as exc:
            raise TestbedUnavailable(f"cannot create the testbed bridge: {exc.stderr.strip()}") from exc
        _ip("addr", "add", f"{hosts[0]}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.node_names):
            ns, veth = f"rl{self.tag}-{i}", f"rlv{self.tag}{i}"
            node = Node(name, ns, str(hosts[9 + i]), veth)
            try:
                _ip("netns", "add", ns)
            except subprocess.CalledProcessError as exc:
                raise TestbedUnavailable(f"cannot create network namespace {ns}: {exc.stderr.strip()}") from exc
            self.nodes[name] = node
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def address(self, name: str) -> str:
        return self.nodes[name].address

    def exec_prefix(self, name: str) -> list[str]:
        """Prefix a command with this to run it inside the node's namespace (`ip netns exec` execs it)."""
        return ["ip", "netns", "exec", self.nodes[name].netns]

    def isolate(self, name: str) -> None:
        me = self.nodes[name]
        for other in self.nodes.values():
            if other.name != name:
                self._blackhole(me.netns, other.address)
                self._blackhole(other.netns, me.address)

    def heal(self, name: str) -> None:
        me = self.nodes[name]
        for ns, addr in list(self._blackholes):
            if ns == me.netns or addr == me.address:
                _ip("-n", ns, "route", "del", "blackhole", f"{addr}/32", check=False)
                self._blackholes.discard((ns, addr))

    def _blackhole(self, ns: str, addr: str) -> None:
        if (ns, addr) not in self._blackholes:
            _ip("-n", ns, "route", "add", "blackhole", f"{addr}/32")
            self._blackholes.add((ns, addr))

    def close(self) -> None:
        # Deleting a namespace deletes its end of the veth, which deletes the pair; the bridge goes last.
        for node in list(self.nodes.values()):
            _ip("netns", "del", node.netns, check=False)
            _ip("link", "del", node.host_veth, check=False)
        self.nodes.clear()
        self._blackholes.clear()
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
            self.bridge = ""


def leftover_namespaces(tag: str | None = None) -> list[str]:
    """Testbed namespaces still present (tests check none is left)."""
    out = _ip("netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    prefix = f"rl{tag}-" if tag else "rl"
    return [n for n in names if n.startswith(prefix)]
