"""Impairments on a link end: UDP loss and ECN (CE) marking by a phantom
queue, both eBPF classifiers (bpf.py) pinned in a private bpffs mount."""
import os
import tempfile

from . import bpf, shaping
from .command import run


def check_marking(k, fraction, cap):
    """Raise ValueError unless 0 < fraction <= 1 (None: not checked) and
    0 < k < cap."""
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"mark fraction {fraction}: need 0 < f <= 1")
    if not 0 < k < cap:
        raise ValueError(f"mark K {k} B: need 0 < K < the queue limit ({cap} B)")


class Impairments:
    """Loss and marking on a Fabric's links. Uses the Fabric's tor/agg
    names, prefix, queue and uplink_rate, and keeps lossy, marking and
    bpffs in it."""

    # Both are eBPF classifiers on the clsact egress hook of a link end, each
    # at its own priority, so one link can have both: the loss filter runs
    # first (a dropped packet never enters the phantom queue), a surviving
    # packet goes on to the marker (TC_ACT_UNSPEC continues to the next prio).
    PRIO_LOSS, PRIO_MARK = 1, 2

    def _clsact(self, ns, dev):
        if (ns, dev) not in self.lossy and (ns, dev) not in self.marking:
            run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "clsact"])

    def _del_filter(self, ns, dev, prio):
        run(["tc", "-n", ns, "filter", "del", "dev", dev, "egress", "prio", str(prio)],
            check=False)

    def set_loss(self, tor, agg, prob, both=True):
        """Drop UDP on the link ToR `tor` <-> agg `agg` with probability prob
        (1.0 = black hole; 0 = remove). Routing does not know."""
        ends = [(self.tor(tor), f"u{agg}")] + ([(self.agg(agg), f"d{tor}")] if both else [])
        for ns, dev in ends:
            key = (ns, dev)
            if key in self.lossy:
                self._del_filter(ns, dev, self.PRIO_LOSS)
            if prob <= 0:
                self.lossy.pop(key, None)
                continue
            self._clsact(ns, dev)
            pin = os.path.join(self._bpffs(), f"loss-{ns}-{dev}-{int(prob * 1e6)}")
            if not os.path.exists(pin):
                bpf.load_and_pin(prob, pin)
            run(["tc", "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
                 str(self.PRIO_LOSS), "bpf", "object-pinned", pin, "da"])
            self.lossy[key] = prob

    def set_marking(self, ns, dev, rate_bps, k, cap=None):
        """ECN CE marking on the egress of device `dev` in namespace `ns`: a
        phantom queue drained at rate_bps (bits/s; a bit below the link's tbf
        rate) marks ECT packets CE while its backlog exceeds k bytes; its
        backlog is capped at `cap` bytes (default: the fabric's queue limit,
        as a real queue could not hold more). rate_bps 0 or None removes it
        (and its counters)."""
        key = (ns, dev)
        if key in self.marking:
            self._del_filter(ns, dev, self.PRIO_MARK)
            old = self.marking.pop(key)
            for f in (old["prog"], old["map"]):
                try:
                    os.unlink(f)
                except FileNotFoundError:
                    pass
        if not rate_bps:
            return
        cap = cap or self.queue
        check_marking(k, None, cap)
        self._clsact(ns, dev)
        base = os.path.join(self._bpffs(), f"mark-{ns}-{dev}")
        prog, mp = base + "-prog", base + "-map"
        bpf.load_marker(rate_bps / 8, k, cap, prog, mp)
        self.marking[key] = {"rate_bps": rate_bps, "k": k, "cap": cap, "prog": prog, "map": mp}
        run(["tc", "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
             str(self.PRIO_MARK), "bpf", "object-pinned", prog, "da"])

    def set_link_marking(self, tor, agg, k, fraction=0.95, cap=None, both=True):
        """Marking on the link ToR `tor` <-> agg `agg` (k None: off), drained
        at fraction x uplink_rate; needs a shaped uplink."""
        if k is not None:
            if not self.uplink_rate:
                raise ValueError("marking needs a link rate (uplink_rate)")
            check_marking(k, fraction, cap or self.queue)
        rate = shaping.rate_bps(self.uplink_rate) * fraction if k is not None else 0
        ends = [(self.tor(tor), f"u{agg}")] + ([(self.agg(agg), f"d{tor}")] if both else [])
        for ns, dev in ends:
            self.set_marking(ns, dev, rate, k, cap)

    def _bpffs(self):
        if not self.bpffs:
            d = tempfile.mkdtemp(prefix=self.prefix + "bpf")
            run(["mount", "-t", "bpf", self.prefix + "bpf", d])
            self.bpffs = d
        return self.bpffs
