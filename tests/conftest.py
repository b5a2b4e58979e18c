"""Test-suite set-up: quiet TensorFlow, and no TFF worker outlives the suite."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from tff_algos import runtime  # pylint: disable=g-import-not-at-top

runtime.install_worker_cleanup()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  runtime.kill_workers()
  runtime.disarm_service_managers()
