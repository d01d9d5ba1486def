"""What the guest tests share: the launcher library on sys.path."""
import os
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "tools"))

import vstellar_guest  # noqa: E402,F401
import vstellar_perftest  # noqa: E402,F401
