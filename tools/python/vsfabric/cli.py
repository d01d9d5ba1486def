"""vsfabric-cli: build a two-tier Clos in network namespaces and keep it, show
it, or remove leftovers.

  vsfabric-cli up [--tors T --hosts H --aggs A --uplink-rate R --host-rate R
                   --queue BYTES --delay D --hash-seed S --loss AGG:PROB
                   --mark-k BYTES --mark-fraction F --mark-cap BYTES --ipv6]
        build, print names and addresses, wait until Ctrl-C/SIGTERM (or
        --hold S seconds), print per-uplink counters, remove everything.
        --mark-k turns ECN marking on: a phantom queue (eBPF) on every shaped
        switch port, drained at F (0.95) x the link rate, marks ECT packets
        CE above K bytes; per-port marks are printed at the end.
        --ipv6 adds the IPv6 underlay: every host and link also gets an IPv6
        address (fd76:7366::/32), with the same ECMP routes (L4 hash).
  vsfabric-cli cleanup   remove namespaces/bpffs left by killed runs (vsf<pid>-)
  vsfabric-cli list      list vsf namespaces
Run a command inside the fabric from another shell with
  ip netns exec vsf<pid>-h0.0 vstellar-harness --role client ...
"""
import argparse
import os
import signal
import sys
import time

import vsfabric


def main():
    p = argparse.ArgumentParser(prog="vsfabric-cli", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["up", "cleanup", "list"])
    p.add_argument("--tors", type=int, default=2)
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--aggs", type=int, default=4)
    p.add_argument("--uplink-rate")
    p.add_argument("--host-rate")
    p.add_argument("--queue", type=int, default=1_000_000)
    p.add_argument("--delay")
    p.add_argument("--hash-seed", type=int)
    p.add_argument("--loss", action="append", default=[], help="AGG:PROB on ToR 0's uplink AGG")
    p.add_argument("--mark-k", type=int, help="ECN marking on: phantom queue threshold K (bytes)")
    p.add_argument("--mark-fraction", type=float, default=0.95,
                   help="phantom queue drain rate / link rate (0.95)")
    p.add_argument("--mark-cap", type=int, help="phantom queue backlog cap (bytes; default --queue)")
    p.add_argument("--ipv6", action="store_true",
                   help="IPv6 underlay too: addresses in fd76:7366::/32, ECMP on the L4 hash")
    p.add_argument("--hold", type=float, help="seconds to keep the fabric (default: until signal)")
    a = p.parse_args()
    if a.cmd == "list":
        print("\n".join(vsfabric.list_namespaces()))
        return 0
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    if a.cmd == "cleanup":
        gone = vsfabric.cleanup_stale()
        print(f"removed {len(gone)} namespaces")
        return 0
    try:
        fab = vsfabric.Fabric(tors=a.tors, hosts=a.hosts, aggs=a.aggs, uplink_rate=a.uplink_rate,
                              host_rate=a.host_rate, queue=a.queue, delay=a.delay,
                              hash_seed=a.hash_seed, mark_k=a.mark_k,
                              mark_fraction=a.mark_fraction, mark_cap=a.mark_cap,
                              ipv6=a.ipv6)
        fab.build()
    except ValueError as e:  # a bad option; build() removed what it made
        print(f"vsfabric-cli: {e}", file=sys.stderr)
        return 2
    try:
        for spec in a.loss:
            agg, prob = spec.split(":")
            fab.set_loss(0, int(agg), float(prob))
        print(f"built in {fab.build_s:.2f} s: {len(fab.namespaces)} namespaces"
              + (f", CE marking on {len(fab.marking)} switch ports" if fab.marking else ""))
        for t in range(a.tors):
            print(f"ToR {fab.tor(t)}: uplinks u0..u{a.aggs - 1}")
            for i in range(a.hosts):
                print(f"  host {fab.host(t, i)}  {fab.host_ip(t, i)}"
                      + (f"  {fab.host_ip6(t, i)}" if a.ipv6 else ""))
        sys.stdout.flush()
        stop = []
        signal.signal(signal.SIGTERM, lambda *x: stop.append(1))
        end = time.time() + a.hold if a.hold else None
        try:
            while not stop and (end is None or time.time() < end):
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        for t in range(a.tors):
            print(f"{fab.tor(t)} uplink tx bytes: {fab.uplink_bytes(t)}")
        for (ns, dev), m in sorted(fab.mark_counters().items()):
            print(f"{ns} {dev}: CE marked {m['marked']} of {m['pkts']} packets "
                  f"(over K but not ECT: {m['over_not_ect']}, already CE: {m['over_ce']}; "
                  f"phantom backlog max {m['max_backlog']} B)")
    finally:
        fab.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
