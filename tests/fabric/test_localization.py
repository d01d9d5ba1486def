#!/usr/bin/python3
"""Failure localization on the namespace Clos (docs/fabric.md, "Failure
localization"): a harness client with --locate-faults sprays 128 paths
from h0.0 to h1.0 over 4 aggregation switches while the fabric breaks a
link; the client must name that link (its two end addresses) with the right
kind, and clear it once the link is repaired. Behaviour only:

1. a black hole on a ToR uplink, then on a spine link (agg -> other ToR):
   each named as a black hole within 2 s of the fault, cleared within 5 s of
   the repair;
2. 2% loss on one link: named as lossy;
3. one link shaped to a tenth of its rate: named as slow;
4. two faults at once (a black hole and 2% loss, on different links): both
   named;
5. a clean run of 60 s: no fault reported.

In every run, no other link is named, and every posted message completes.
"""
import sys
import time

import fabtest

RATE = "200mbit"
ARGS = ["--paths", 128, "--size", "64K", "--depth", 16, "--no-path-detail", "--locate-faults",
        "--stall-ms", 60000]


def run(fab, harness, duration, schedule):
    """One client run with `schedule`: [(seconds from the start, action)].
    Returns (client JSON, {action index: wall time it ran})."""
    done = {}

    def during(t0):
        for k, (at, action) in enumerate(schedule):
            time.sleep(max(0, t0 + at - time.time()))
            done[k] = time.time()
            action()

    r = harness.run_pairs(fab, [((0, 0), (1, 0))], ARGS, duration, during=during)[0]
    return r, done


def named(tele, ends, kind):
    """The history entries naming the link with these end addresses as `kind`."""
    return [f for f in (tele or {}).get("history", [])
            if f.get("link") and f["link"]["to"] in ends and f["kind"] == kind]


def others(tele, allowed):
    return [f for f in (tele or {}).get("history", [])
            if not f.get("link") or f["link"]["to"] not in allowed]


def show(tele):
    for f in (tele or {}).get("history", []):
        link = f"{f['link']['from']} -> {f['link']['to']}" if f.get("link") else "no route"
        print(f"     {link} {f['kind']} paths {f['paths_affected']} confidence "
              f"{f['confidence']} ({f['evidence']})")


def common(check, what, r):
    c = r.get("client") or {}
    tele = c.get("telemetry") or {}
    check(c.get("posted") is not None and c.get("posted") == c.get("completed")
          and c.get("errors", 1) == 0 and r.get("client_rc") == 0,
          f"{what}: every posted message completed (rc {r.get('client_rc')}, posted "
          f"{c.get('posted')}, completed {c.get('completed')})")
    check(tele.get("routes_known", 0) >= 120,
          f"{what}: routes known for {tele.get('routes_known')} of {tele.get('active_paths')} paths "
          f"({tele.get('probes_sent')} probes, {tele.get('probe_replies')} answered)")
    return tele


def timely(check, what, faults, t_fault, t_repair, within=2.0, clear_within=5.0):
    if not faults:
        check(False, f"{what}: named")
        return
    f = faults[0]
    check(f["found"] - t_fault <= within,
          f"{what}: named {f['found'] - t_fault:.2f} s after the fault (limit {within} s), "
          f"confidence {f['confidence']}")
    if t_repair is not None:
        cl = f.get("cleared")
        check(cl is not None and t_repair <= cl <= t_repair + clear_within,
              f"{what}: cleared {('%.2f s' % (cl - t_repair)) if cl else 'never'} after the repair "
              f"(limit {clear_within} s)")


def main():
    env = fabtest.begin()
    if env is None:
        return fabtest.SKIP
    vsfabric, harness, check = env
    with vsfabric.Fabric(tors=2, hosts=1, aggs=4, uplink_rate=RATE, host_rate="400mbit",
                         queue=200_000) as fab:
        up, spine = fab.link_ends(0, 1), fab.link_ends(1, 2)

        # 1. Black holes: ToR 0's uplink to agg 1, then agg 2's link to ToR 1.
        r, t = run(fab, harness, 18, [
            (4, lambda: fab.set_loss(0, 1, 1.0)), (7, lambda: fab.set_loss(0, 1, 0)),
            (9, lambda: fab.set_loss(1, 2, 1.0)), (12, lambda: fab.set_loss(1, 2, 0))])
        tele = common(check, "black holes", r)
        show(tele)
        timely(check, f"black hole on the ToR uplink {up}", named(tele, up, "black_hole"), t[0], t[1])
        timely(check, f"black hole on the spine link {spine}", named(tele, spine, "black_hole"),
               t[2], t[3])
        check(not others(tele, up + spine), "black holes: no other link named")

        # 2. 2% loss on ToR 0's uplink to agg 3.
        lossy = fab.link_ends(0, 3)
        r, t = run(fab, harness, 14, [(4, lambda: fab.set_loss(0, 3, 0.02)),
                                      (10, lambda: fab.set_loss(0, 3, 0))])
        tele = common(check, "2% loss", r)
        show(tele)
        check(bool(named(tele, lossy, "lossy")), f"2% loss on {lossy}: named as lossy")
        check(not others(tele, lossy), "2% loss: no other link named")

        # 3. ToR 0's uplink to agg 2 at a tenth of its rate.
        slow = fab.link_ends(0, 2)
        r, t = run(fab, harness, 14, [(4, lambda: fab.set_link_rate(0, 2, "20mbit")),
                                      (10, lambda: fab.set_link_rate(0, 2, RATE))])
        tele = common(check, "slow link", r)
        show(tele)
        check(bool(named(tele, slow, "slow")), f"{slow} at a tenth of its rate: named as slow")
        check(not others(tele, slow), "slow link: no other link named")

        # 4. Two at once: a black hole on ToR 0's uplink to agg 0 and 2% loss
        # on agg 3's link to ToR 1.
        hole, loss = fab.link_ends(0, 0), fab.link_ends(1, 3)
        r, t = run(fab, harness, 14, [
            (4, lambda: (fab.set_loss(0, 0, 1.0), fab.set_loss(1, 3, 0.02))),
            (10, lambda: (fab.set_loss(0, 0, 0), fab.set_loss(1, 3, 0)))])
        tele = common(check, "two faults", r)
        show(tele)
        check(bool(named(tele, hole, "black_hole")), f"two faults: the black hole on {hole} named")
        check(bool(named(tele, loss, "lossy")), f"two faults: the 2% loss on {loss} named")
        check(not others(tele, hole + loss), "two faults: no other link named")

        # 5. Nothing broken for 60 s.
        r, t = run(fab, harness, 60, [])
        tele = common(check, "clean run", r)
        show(tele)
        check(not tele.get("history"), f"clean run of 60 s: no fault reported "
              f"({len(tele.get('history', []))} reported)")
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
