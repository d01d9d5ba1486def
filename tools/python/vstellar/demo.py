"""make demo: two guests with the vStellar device run ib_write_bw against each
other over the sprayed transport, and the demo prints the bandwidth and how
the traffic spread over the paths of the fabric.

  guest0 (198.18.1.1) ─ vstellard in host h0.0 ─ ToR t0 ═╗ aggs a0..a(A-1) ╔═ ToR t1 ─ host h1.0 vstellard ─ guest1 (198.18.2.1)

The two vstellard "hosts" are the host namespaces of a tools/fabric Clos
(2 ToRs, A aggregation switches, Linux ECMP on the UDP 5-tuple): every
packet picks a path (a UDP source port) and the ToR hashes it onto an
uplink. The guests carry their host's fabric address on eth0 (the GID is
eth0's IPv4, and vstellard sends to the IPv4 in the destination GID); they
reach each other for perftest's TCP exchange over the launcher's own L2.

Options (environment): DEMO_AGGS (default 8), DEMO_PATHS (default 128),
DEMO_SIZE (65536), DEMO_ITERS (1000), DEMO_RXE=1 for the old rxe baseline.
"""
import os
import sys

from vstellar import guest as vg, perftest as pt

size = int(os.environ.get("DEMO_SIZE", "65536"))
iters = int(os.environ.get("DEMO_ITERS", "1000"))
tests = [("ib_write_bw", f"-s {size} -n {iters} -F --report_gbits")]
echo = lambda line: print(line, flush=True)


def fail(results, daemons=()):
    for i, (status, out, console) in enumerate(results):
        if status:
            print("\n".join(console[-60:]), file=sys.stderr)
            if i < len(daemons):
                print(daemons[i]["log"][-2000:], file=sys.stderr)
            sys.exit(f"vstellar demo: guest{i} failed with status {status}")


if os.environ.get("DEMO_RXE") == "1":
    server, client = pt.perftest_pair(tests, "rxe0", setup=pt.RXE_SETUP)
    print("vstellar demo: booting two guests (TCG) with rxe on virtio-net (baseline)")
    try:
        results = vg.run_guests([server, client], modules=pt.RXE_MODULES, timeout=600, echo=echo)
    except vg.GuestError as e:
        sys.exit(f"vstellar demo: error: {e}")
    fail(results)
    r = pt.parse_bw(pt.split_sections(results[1][1])["ib_write_bw " + tests[0][1]])[0]
    print(f"\nvstellar demo: ib_write_bw over rxe, {r['bytes']} B x {r['iterations']}: "
          f"{r['bw_avg_gbps']:.3f} Gb/s average")
    sys.exit(0)

import vsfabric  # noqa: E402  (installs its own clean-up at exit and on signals)

aggs = int(os.environ.get("DEMO_AGGS", "8"))
paths = int(os.environ.get("DEMO_PATHS", "128"))
fab = vsfabric.Fabric(tors=2, hosts=1, aggs=aggs)
try:
    fab.build()
    hosts = [(fab.host(t, 0), fab.host_ip(t, 0)) for t in range(2)]
    # /16: both fabric addresses are on-link for the guests' own L2.
    addrs = [f"{ip}/16" for _ns, ip in hosts]
    server, client = pt.perftest_pair(tests, pt.VSTELLAR_DEVICE, setup=pt.VSTELLAR_SETUP,
                                      common=pt.VSTELLAR_COMMON)
    print(f"vstellar demo: fabric of 2 ToRs x {aggs} aggregation switches (ECMP on the UDP "
          f"5-tuple); vstellard in {hosts[0][0]} ({hosts[0][1]}) and {hosts[1][0]} "
          f"({hosts[1][1]}), {paths} paths per connection; booting two guests (TCG)")
    before = [fab.uplink_bytes(t) for t in range(2)]
    daemons = []
    try:
        results = vg.run_guests([server, client], vstellar=True, vstellar_hosts=hosts,
                                guest_addrs=addrs, vstellard_args=[f"--paths={paths}"],
                                timeout=600, echo=echo, daemons_out=daemons)
    except vg.GuestError as e:
        sys.exit(f"vstellar demo: error: {e}")
    after = [fab.uplink_bytes(t) for t in range(2)]
    fail(results, daemons)
    rows = pt.parse_bw(pt.split_sections(results[1][1]).get("ib_write_bw " + tests[0][1], []))
    if not rows:
        sys.exit("vstellar demo: no ib_write_bw result in the client's output")
    r = rows[0]
    print(f"\nvstellar demo: ib_write_bw guest1 -> guest0 over vStellar, {r['bytes']} B x "
          f"{r['iterations']}: {r['bw_avg_gbps']:.3f} Gb/s average (TCG guests)")
    # Data flows from the client (guest1, ToR t1) to the server (ToR t0):
    # t1's uplinks carry the data, t0's the acknowledgements.
    for t, what in ((1, "data, guest1 -> guest0"), (0, "ACKs, guest0 -> guest1")):
        d = [a - b for a, b in zip(after[t], before[t])]
        total = sum(d) or 1
        print(f"\nToR t{t} uplinks ({what}): {sum(d)} bytes")
        for a, v in enumerate(d):
            bar = "#" * round(40 * v / max(max(d), 1))
            print(f"  u{a:<3} {v:>12} B  {100 * v / total:5.1f}%  {bar}")
        if total > 1:
            mean = total / len(d)
            print(f"  max-min spread: {100 * (max(d) - min(d)) / mean:.1f}% of the mean "
                  f"(uplinks used: {sum(1 for v in d if v)}/{len(d)})")
finally:
    fab.destroy()
