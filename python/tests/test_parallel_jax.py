"""tessera.parallel.jax on 2 and 4 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=4,
which must be set before JAX starts: the check runs in its own process, bounded in time)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")


def test_expert_and_context_parallel_on_2_and_4_devices():
    script = os.path.join(os.path.dirname(__file__), "parallel_jax_check.py")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
