"""Test-suite set-up: quiet TensorFlow, and no TFF worker outlives the suite."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# After the environment variable on purpose: it must precede any TF import.
from tff_algos import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

runtime.install_worker_cleanup()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  runtime.kill_workers()
  runtime.disarm_service_managers()
