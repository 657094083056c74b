"""SIGTERM inside a real run's block unwinds like Ctrl-C (so its cleanup runs); outside it the
previous handler is back. The end-to-end check (a controller stopped by SIGTERM leaves nothing)
is tests/runtime/test_local_run.py::test_interrupting_the_controller_leaves_nothing."""

from __future__ import annotations

import os
import signal
import time

import pytest

from reamer.backends.local.session import sigterm_as_interrupt


def test_sigterm_raises_keyboard_interrupt_inside_and_the_old_handler_returns():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs between bytecodes: long before this ends
            finally:
                cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_during_the_cleanup_waits_for_it():
    """A second Ctrl-C or SIGTERM while a run cleans up is noted, not raised: the cleanup's
    remaining steps (processes, cgroups, namespaces) still run. The handlers come back after."""
    import os
    import signal

    from reamer.backends.local.session import _signals_held

    before = signal.getsignal(signal.SIGINT)
    done = []
    with _signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("rest of the cleanup")
    assert done == ["rest of the cleanup"] and signal.getsignal(signal.SIGINT) is before
