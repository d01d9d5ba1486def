"""Shared by the packaging tests: the .debs `make deb` made, unpacked."""
import glob
import os
import subprocess
import tempfile

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEB_DIR = os.environ.get("VSTELLAR_DEB_DIR", os.path.join(TOP, "build", "deb"))
PACKAGES = ("vstellar-dkms", "vstellar-provider-rdma44", "vstellar-provider-rdma56",
            "vstellard", "vstellar-qemu")


def deb(package):
    """The path of PACKAGE's .deb in DEB_DIR; fails if `make deb` did not make it."""
    found = glob.glob(os.path.join(DEB_DIR, f"{package}_*.deb"))
    if len(found) != 1:
        raise AssertionError(f"{package}: expected one .deb in {DEB_DIR} (run `make deb`), found {found}")
    return found[0]


def field(package, name):
    return subprocess.run(["dpkg-deb", "-f", deb(package), name], capture_output=True, text=True,
                          check=True).stdout.strip()


def contents(package):
    """The paths PACKAGE installs (no leading '.'), with symlink targets as 'path -> target'."""
    out = subprocess.run(["dpkg-deb", "-c", deb(package)], capture_output=True, text=True, check=True).stdout
    paths = []
    for line in out.splitlines():
        path = line.split(None, 5)[5]
        paths.append(path[1:] if path.startswith("./") else path)
    return paths


def unpack(package, into=None):
    """Unpack PACKAGE's files into a new (or the given) directory; returns it."""
    into = into or tempfile.mkdtemp(prefix=f"{package}-")
    subprocess.run(["dpkg-deb", "-x", deb(package), into], check=True)
    return into


def unpack_installed(package, into=None):
    """Unpack PACKAGE and point its relative symlinks where they point once
    installed (dh_link makes links to other packages' files relative to the
    installed path), so its programs run from the unpacked tree as from /."""
    into = unpack(package, into)
    for dirpath, dirnames, filenames in os.walk(into):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not os.readlink(path).startswith("/"):
                installed_dir = "/" + os.path.relpath(dirpath, into)
                target = os.path.normpath(os.path.join(installed_dir, os.readlink(path)))
                os.unlink(path)
                os.symlink(target, path)
    return into
