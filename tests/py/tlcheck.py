"""Pass/fail counting shared by the Python checks: each records results with
check() and ends with summary(), whose last line "N passed, N failed" is what
tests/run.sh sums."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
passed = 0
failed = 0


def check(cond, what):
    """Counts one result; prints what failed. Returns cond."""
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)
    return cond


def summary():
    """Prints the summary line; returns the exit status."""
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def finish():
    sys.exit(summary())


class timed:
    """`with timed("part"):` prints how long the part took, so a run's log
    shows where a slow check spends its time (CI has 90 minutes for all)."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        import time
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        import time
        print(f"   [{self.what}: {time.monotonic() - self.t0:.1f} s]")
        return False
