"""vsfabric: a two-tier Clos fabric in Linux network namespaces.

    hosts -- ToR switches -- A aggregation switches (A up to 60 and more)

Every switch and host is a network namespace named with a per-process prefix
(`vsf<pid>-`); links are veth pairs, shaped with tbf (rate, burst, queue
limit) where a rate is given; ToRs spread traffic to other ToRs over all
uplinks with Linux ECMP and the L4 hash (fib_multipath_hash_policy=1), so a
UDP source port picks the uplink. Loss on a link and ECN (CE) marking by a
phantom queue are eBPF tc classifiers (see bpf.py). Everything the fabric
made is removed by Fabric.destroy(), which also runs at exit and on
SIGINT/SIGTERM/SIGHUP.

Addressing (all in the benchmarking range 198.18.0.0/15):
  host i under ToR t       198.18.(t+1).(2i+1)/31, its ToR port 198.18.(t+1).(2i)/31
  ToR t <-> agg a link     n = 2a (ToR side) or 2a+1 (agg side):
                           198.19.(4t + n/256).(n%256)/31
With Fabric(ipv6=True) the same plan in IPv6 (ULA fd76:7366::/32), the same
ECMP routes, net.ipv6.fib_multipath_hash_policy=1:
  host i under ToR t       fd76:7366:18:(t+1)::(2i+1)/127, ToR port ...::(2i)/127
  ToR t <-> agg a link     fd76:7366:19:t::n/127
(numbers in the groups are hex). See docs/fabric.md.

The package by concern: fabric (Fabric: settings, build, teardown,
processes in its namespaces), topology (names, addresses, veth links, ECMP
routes), shaping (tbf, netem), impairments (loss, ECN marking; the eBPF
programs are in bpf), counters, netns (entering and listing namespaces),
cleanup (at exit, on signals, after a killed run), command (running ip and
tc). The experiments share exp and harness (vstellar-harness pairs across
a fabric); cli and experiments.* are the commands in tools/fabric.
"""
from .cleanup import cleanup_stale
from .fabric import Fabric
from .netns import Netns, list_namespaces
from .shaping import rate_bps

__all__ = ["Fabric", "Netns", "cleanup_stale", "list_namespaces", "rate_bps"]
