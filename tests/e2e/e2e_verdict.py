"""The common end of the inline log checks in tests/e2e/*.sh (e2e_python imports it)."""
import re
import sys


def finish(name, text, problems, passed):
    """Adds the daemons' error lines (" E [rank") in the log TEXT to PROBLEMS, then prints
    one verdict line for the check NAME and exits 1 if there is any problem."""
    errors = [line for line in text.splitlines() if re.search(r" E \[rank", line)]
    if errors:
        problems.append("daemon errors: " + "; ".join(errors[:3]))
    if problems:
        print(f"{name}: FAIL\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"{name}: PASS  {passed}")
