"""Classic pcap files (little-endian, Ethernet), as tcpdump writes them:
the RoCE v2 captures of the tests and the fuzz seeds."""
import struct


def frames(path):
    """Every captured frame of the file, in order (bytes, as captured)."""
    with open(path, "rb") as f:
        data = f.read()
    if struct.unpack("<I", data[:4])[0] != 0xa1b2c3d4:
        raise ValueError(f"{path}: not a little-endian classic pcap")
    off, out = 24, []
    while off + 16 <= len(data):
        caplen = struct.unpack("<I", data[off + 8:off + 12])[0]
        out.append(data[off + 16:off + 16 + caplen])
        off += 16 + caplen
    return out
