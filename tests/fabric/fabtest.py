"""What the fabric tests share: the preflight (root and network namespaces,
else the test is skipped with exit status 77) and a checker that prints
each check and remembers the failed ones."""
import os
import subprocess

SKIP = 77


def preflight():
    """None when a fabric can be built here; otherwise SKIP, after saying why."""
    if os.geteuid() != 0:
        print("SKIP: needs root")
        return SKIP
    probe = f"vsf{os.getpid()}-probe"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        print("SKIP: cannot create network namespaces")
        return SKIP
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def begin():
    """(vsfabric, harness, Checks()) with stale fabrics removed, or None
    when the test must be skipped (preflight said why)."""
    if preflight():
        return None
    import vsfabric
    from vsfabric import harness
    vsfabric.cleanup_stale()
    return vsfabric, harness, Checks()


class Checks:
    def __init__(self):
        self.fails = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.fails.append(what)

    def result(self):
        """The test's exit status, after a one-line verdict."""
        print("PASS" if not self.fails else f"{len(self.fails)} check(s) failed")
        return 1 if self.fails else 0
