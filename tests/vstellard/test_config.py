#!/usr/bin/env python3
"""vstellard --config: the file the systemd unit passes (/etc/vstellar/NAME.conf).

A bad file stops the daemon with status 2 and one line naming the file, the
line and what is wrong; a good one configures it, and options after --config
on the command line override the file's.
"""
import os
import subprocess
import sys
import tempfile
import unittest

VSTELLARD = sys.argv.pop(1) if len(sys.argv) > 1 else "build/qemu-device/vstellard/vstellard"


class ConfigFile(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.sock = os.path.join(self.dir.name, "vstellard.sock")

    def conf(self, text):
        path = os.path.join(self.dir.name, "test.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def key(self):
        """A fabric key file (32 bytes in hex); its path."""
        key = os.path.join(self.dir.name, "fabric.key")
        with open(key, "w", encoding="utf-8") as f:
            f.write("ab" * 32 + "\n")
        return key

    def starts(self, text):
        """vstellard with this configuration file comes up and listens."""
        p = subprocess.Popen([VSTELLARD, "--config", self.conf(text), "--socket", self.sock],
                             stderr=subprocess.PIPE, text=True)
        try:
            line = p.stderr.readline()
            self.assertTrue(line.startswith(f"vstellard: listening on {self.sock}"), line)
        finally:
            p.terminate()
            p.wait(timeout=30)
            p.stderr.close()

    def refused(self, text, expect):
        path = self.conf(text)
        r = subprocess.run([VSTELLARD, "--config", path, "--socket", self.sock],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr, f"vstellard: {path}:{expect}\n")

    def test_bad_lines_name_the_line_and_the_reason(self):
        self.refused("paths = 999\n", "1: paths = 999: not a number in 1..256")
        self.refused("# RNIC on eth1\nip = 192.0.2.1\n\nfoo = 1\n", "4: unknown option 'foo'")
        self.refused("ip = 192.0.2.300\n", "1: ip = 192.0.2.300: not an IPv4 or IPv6 address")
        self.refused("pin = lazy  # default\npin = sometimes\n", "2: pin = sometimes: not lazy or eager")
        self.refused("memory-limit = 4X\n",
                     "1: memory-limit = 4X: not a size (a positive number with an optional K, M or G)")
        self.refused("allow-unsealed-memory = maybe\n", "1: allow-unsealed-memory = maybe: not yes or no")
        self.refused("paths\n", "1: expected `option = value`")
        self.refused("port =\n", "1: port: no value")
        self.refused("config = /etc/passwd\n", "1: unknown option 'config'")

    def test_missing_file(self):
        path = os.path.join(self.dir.name, "absent.conf")
        r = subprocess.run([VSTELLARD, "--config", path, "--socket", self.sock],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"vstellard: {path}: No such file or directory\n")

    def test_good_file_and_command_line_override(self):
        path = self.conf("# a comment\n  translation = atc\npin = eager\npaths = 8\n"
                         "allow-unsealed-memory = no\n")
        p = subprocess.Popen([VSTELLARD, "--config", path, "--pin=lazy", "--socket", self.sock],
                             stderr=subprocess.PIPE, text=True)
        try:
            line = p.stderr.readline()
            self.assertEqual(line, f"vstellard: listening on {self.sock} (pin=lazy, translation=atc)\n")
        finally:
            p.terminate()
            p.wait(timeout=30)
            p.stderr.close()

    def test_require_integrity_refuses_to_start_without_a_key(self):
        r = subprocess.run([VSTELLARD, "--require-integrity", "--socket", self.sock],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr, "vstellard: --require-integrity: no --integrity-key configured\n")
        self.assertFalse(os.path.exists(self.sock))
        # From a file too, with the key on a later line.
        self.starts(f"require-integrity = yes\nintegrity-key = {self.key()}\n")
        r = subprocess.run([VSTELLARD, "--config", self.conf("require-integrity = yes\n"), "--socket", self.sock],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)

    def test_integrity_alg(self):
        self.refused("integrity-alg = aes-gcm\n", "1: integrity-alg = aes-gcm: not chacha20-poly1305 or aes-gmac")
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
        if not {"aes", "pclmulqdq"} <= set(flags):
            self.skipTest("aes-gmac needs AES-NI and PCLMUL")
        self.starts(f"integrity-key = {self.key()}\nintegrity-alg = aes-gmac\n")


if __name__ == "__main__":
    unittest.main()
