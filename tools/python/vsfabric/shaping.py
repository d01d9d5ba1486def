"""Link shaping: tbf (rate, burst, queue limit) on a link end, netem delay
in front of it when asked for."""
import re

from .command import run


def rate_bps(r):
    """A tbf rate string ("200mbit") in bits per second."""
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", r.lower())
    if not m:
        raise ValueError(f"rate {r}: use e.g. 200mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


class Shaping:
    """The qdiscs of a Fabric's link ends. Uses the Fabric's delay and queue."""

    def _shape(self, ns, dev, rate):
        if not rate and not self.delay:
            return
        if self.delay:
            run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                 "netem", "delay", self.delay, "limit", "100000"])
        if rate:
            bps = rate_bps(rate)
            burst = max(32 * 1024, int(bps / 8 / 1000))  # >= 1 ms of line rate
            parent = ["parent", "1:"] if self.delay else ["root"]
            run(["tc", "-n", ns, "qdisc", "add", "dev", dev] + parent +
                ["handle", "10:", "tbf", "rate", rate, "burst", str(burst),
                 "limit", str(self.queue)])

    def set_link_rate(self, tor, agg, rate):
        """Change the tbf rate of the ToR `tor` <-> agg `agg` link, both
        ends (a slow link: rate a tenth of uplink_rate, say); the queue
        limit stays. The fabric must have been built with uplink_rate."""
        if not self.uplink_rate:
            raise ValueError("set_link_rate needs a fabric built with uplink_rate")
        bps = rate_bps(rate)
        burst = max(32 * 1024, int(bps / 8 / 1000))
        parent = ["parent", "1:"] if self.delay else ["root"]
        for ns, dev in ((self.tor(tor), f"u{agg}"), (self.agg(agg), f"d{tor}")):
            run(["tc", "-n", ns, "qdisc", "change", "dev", dev] + parent +
                ["handle", "10:", "tbf", "rate", rate, "burst", str(burst), "limit", str(self.queue)])
