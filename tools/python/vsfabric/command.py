"""Running the ip and tc commands that build and change a fabric."""
import subprocess


def run(cmd, input=None, check=True):
    """Run cmd (a list) with `input` on stdin; its CompletedProcess. With
    check, a failure raises RuntimeError with the command and its stderr."""
    p = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()[:2000]}")
    return p
