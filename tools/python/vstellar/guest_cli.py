"""vstellar-guest: boot vStellar test guests under QEMU and run commands in them."""

import argparse
import sys

from vstellar import guest as vg

DESCRIPTION = """\
Boot test guests (the pinned Debian 6.1 kernel and vStellar's initramfs) under
QEMU, run a shell command in each, print what it prints and exit with its exit
status. Guests run under TCG, or under KVM with VSTELLAR_ACCEL=kvm.

Each guest gets its own network namespace (a "host"); the namespaces are
joined into one Ethernet segment, guest i having address 10.77.0.<i+1>/24 on
eth0. Inside a guest, $VSTELLAR_INDEX, $VSTELLAR_SELF_IP and $VSTELLAR_PEER_IP
(the next guest's address) are set. Everything made (QEMU processes,
namespaces, tap devices, bridges) is removed when the command ends, fails,
times out or is interrupted.

With --vstellar each guest also gets the vStellar device: a vstellard per
host namespace (UDP on 10.77.0.<i+1>, port 47000.., over a network of its
own between the host namespaces), QEMU with shared memfd RAM and
vhost-user-vstellar-pci, and vstellar, ib_uverbs and rdma_ucm loaded in the
guest; the daemons are stopped on every exit path. --shared-daemon serves all
guests from one vstellard (one device socket and address set per guest, as
one daemon per host serves its tenants), --daemons K from K, each serving a
contiguous group. --ipv6 also gives guest i fd77::<i+1>/64 ($VSTELLAR_SELF_IP6,
$VSTELLAR_PEER_IP6), which its device may use as a RoCE v2 GID.

With --accel SIZE each guest also gets vStellar's emulated accelerator, a PCI
device with SIZE of device memory (a shared memfd, so vstellard can reach it
too), and vstellar_accel loaded: /dev/vstellar-accel0 hands out that memory
as dmabufs (docs/accelerator.md).
"""

EPILOG = """\
exit status:
  the command's own status; with several guests, the first non-zero one;
  124 when a guest timed out, 125 when a guest stopped before its command
  finished (kernel panic, QEMU error: the console is printed), 2 on a usage
  or setup error.

examples:
  vstellar-guest run -- ibv_devices
  vstellar-guest run --modules rdma_rxe -- 'rdma link add rxe0 type rxe netdev eth0 && ibv_devinfo'
  vstellar-guest run -n 2 --modules rdma_rxe \\
      --cmd 'rdma link add rxe0 type rxe netdev eth0; ib_write_bw -d rxe0' \\
      --cmd 'rdma link add rxe0 type rxe netdev eth0; sleep 2; ib_write_bw -d rxe0 $VSTELLAR_PEER_IP'
  vstellar-guest run --vstellar -- 'ibv_devinfo -d vstellar0'
  vstellar-guest run -n 2 --vstellar \\
      --cmd 'ibv_rc_pingpong -d vstellar0 -g 1' \\
      --cmd 'sleep 2; ibv_rc_pingpong -d vstellar0 -g 1 $VSTELLAR_PEER_IP'
  vstellar-guest run -n 2 --vstellar --shared-daemon --ipv6 \\
      --cmd 'rping -s -a $VSTELLAR_SELF_IP6 -C 10 -v' \\
      --cmd 'sleep 3; rping -c -a $VSTELLAR_PEER_IP6 -C 10 -v'
  vstellar-guest run -n 2 --container \\
      --cmd 'ib_write_bw -d vstellar0 -x 1' \\
      --cmd 'sleep 5; ib_write_bw -d vstellar0 -x 1 $VSTELLAR_PEER_IP'
  vstellar-guest run --accel 64M --vstellar -- 'ls -l /dev/vstellar-accel0'
  vstellar-guest cleanup
"""


def main():
    p = argparse.ArgumentParser(prog="vstellar-guest", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="boot guests and run commands in them",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("-n", "--guests", type=int, default=None,
                   help="number of guests (default: one per --cmd, or 1)")
    r.add_argument("--cmd", action="append", default=[],
                   help="command for the next guest (repeat per guest); the "
                        "last one is used for the rest")
    r.add_argument("--modules", default="", help="comma-separated kernel modules to load first")
    r.add_argument("--mem", type=int, default=1024, help="guest memory in MiB (default 1024)")
    r.add_argument("--timeout", type=float, default=600, help="seconds before a guest is killed (default 600)")
    r.add_argument("--no-net", action="store_true", help="no test network (no namespaces, no NIC)")
    r.add_argument("--qemu", help="QEMU binary (default: recorded by `make guest`)")
    r.add_argument("--image", help="guest image directory (default: recorded by `make guest`)")
    r.add_argument("--qemu-arg", action="append", default=[], help="extra QEMU argument (repeatable)")
    r.add_argument("--vstellar", action="store_true",
                   help="attach the vStellar device (a vstellard per guest unless --shared-daemon or "
                        "--daemons) and load vstellar.ko")
    r.add_argument("--accel", metavar="SIZE", default=None,
                   help="give each guest an emulated accelerator with SIZE of device memory "
                        "(e.g. 64M, a power of two; /dev/vstellar-accel0) and load vstellar_accel.ko")
    r.add_argument("--vstellard-arg", action="append", default=[],
                   help="extra vstellard option with --vstellar (repeatable), e.g. --vstellard-arg=--paths=8")
    r.add_argument("--shared-daemon", action="store_const", const=1, dest="daemons",
                   help="with --vstellar: one vstellard serves every guest, each through a device "
                        "socket with its own addresses (same as --daemons 1)")
    r.add_argument("--daemons", type=int, default=None, metavar="K",
                   help="with --vstellar: K vstellards, each serving a contiguous group of the "
                        "guests (default: one per guest)")
    r.add_argument("--ipv6", action="store_true",
                   help="also give guest i fd77::<i+1>/64 on eth0 (and its daemon that address)")
    r.add_argument("--container", nargs="?", const="", default=None, metavar="IMAGE_DIR",
                   help="secure containers: run each command (default: the image's own) inside the "
                        "container image IMAGE_DIR (rootfs.tar; default: the one `make guest` built), "
                        "one microVM per container with its own vStellar device (implies --vstellar)")
    r.add_argument("-v", "--verbose", action="store_true", help="print the whole serial console")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND for every guest")
    sub.add_parser("cleanup", help="remove namespaces and QEMUs left by runs that were killed")
    args = p.parse_args()

    if args.action == "cleanup":
        for ns in vg.cleanup_stale():
            print(f"removed {ns}")
        return 0

    cmds = list(args.cmd)
    rest = args.command[1:] if args.command[:1] == ["--"] else args.command
    if rest:
        cmds.append(" ".join(rest))
    image = args.image
    if args.container is not None:
        try:
            image, default_cmd = vg.microvm_image(args.container or None, args.image)
        except vg.GuestError as e:
            print(f"vstellar-guest: error: {e}", file=sys.stderr)
            return 2
        args.vstellar = True
        cmds = cmds or [default_cmd]
    if not cmds:
        p.error("no command: give --cmd CMD or -- COMMAND")
    n = args.guests or len(cmds)
    cmds = (cmds + [cmds[-1]] * n)[:n]
    multi = n > 1
    echo = (lambda line: print(line, flush=True)) if multi else (lambda line: print(line[line.index("] ") + 2:], flush=True))
    if args.vstellard_arg and not args.vstellar:
        p.error("--vstellard-arg needs --vstellar")
    if args.daemons is not None and not args.vstellar:
        p.error("--shared-daemon and --daemons need --vstellar")
    if args.daemons is not None and not 1 <= args.daemons <= n:
        p.error(f"--daemons {args.daemons}: need 1..{n} (one per guest at most)")
    if args.accel is not None:
        try:
            vg.accel_size(args.accel)
        except vg.GuestError as e:
            p.error(f"--accel: {e}")
    if args.ipv6 and args.no_net:
        p.error("--ipv6 needs the test network")
    daemons = []
    try:
        results = vg.run_guests(cmds, modules=[m for m in args.modules.split(",") if m], mem=args.mem,
                                timeout=args.timeout, network=not args.no_net, qemu_args=args.qemu_arg,
                                echo=echo, qemu=args.qemu, image=image, vstellar=args.vstellar,
                                vstellard_args=args.vstellard_arg, daemons_out=daemons,
                                ipv6=args.ipv6, shared_daemons=args.daemons, accel=args.accel)
    except vg.GuestError as e:
        print(f"vstellar-guest: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vstellar-guest: interrupted; guests and namespaces removed", file=sys.stderr)
        return 130
    worst = 0
    for i, (status, _out, console) in enumerate(results):
        if args.verbose or status in (124, 125):
            print(f"--- guest{i} console ---", file=sys.stderr)
            print("\n".join(console), file=sys.stderr)
        served = [d for d in daemons if i in d["guests"]]
        # a shared daemon's log once, with its group's first guest
        if served and served[0]["guests"][0] == i and (args.verbose or status in (124, 125)):
            print(f"--- guest{i} vstellard log ---" if len(served[0]["guests"]) == 1 else
                  f"--- vstellard log (guests {', '.join(map(str, served[0]['guests']))}) ---", file=sys.stderr)
            print(served[0]["log"], file=sys.stderr, end="")
        if status == 124:
            print(f"vstellar-guest: guest{i} timed out after {args.timeout:g} s", file=sys.stderr)
        elif status == 125:
            print(f"vstellar-guest: guest{i} stopped before its command finished", file=sys.stderr)
        if status and not worst:
            worst = status
    return worst


if __name__ == "__main__":
    sys.exit(main())
