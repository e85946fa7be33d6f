#!/usr/bin/env python3
"""Runs shardmix-doctor --json with the given arguments and checks its JSON contract:
every field a caller reads is there with the right type, and every self-test passed.
Exits non-zero (naming the field or the failed test) otherwise, and when the doctor did.
Usage: doctor_json_check.py DOCTOR [doctor arguments...]"""
import json
import subprocess
import sys

PROVIDER_FIELDS = {
    "provider": str, "fabric": str, "domain": str, "mr_mode": str, "mode": str,
    "max_msg_size": int, "tx_size": int, "rx_size": int, "iov_limit": int,
    "rma_iov_limit": int, "mr_key_size": int, "threading": str,
    "data_progress": str, "control_progress": str,
}
CHOICE_FIELDS = {"fabric.provider": str, "provider": str, "reason": str, "warning": str, "available": bool}
SELF_TEST_FIELDS = {
    "requested": str, "passed": bool, "provider": str, "domain": str, "granted_mr_mode": str,
    "reads_checked": int, "bytes_checked": int, "bandwidth": list,
}
BANDWIDTH_FIELDS = {"read_bytes": int, "total_bytes": int, "seconds": float, "gb_per_s": float}


def check_fields(obj, fields, where):
    for name, kind in fields.items():
        if name not in obj:
            sys.exit(f"{where}: field '{name}' missing in {obj}")
        value = obj[name]
        ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
        if not ok or (kind is int and isinstance(value, bool)):
            sys.exit(f"{where}: field '{name}' is {value!r}, expected {kind.__name__}")


def main():
    run = subprocess.run(sys.argv[1:] + ["--json"], capture_output=True, text=True, timeout=300)
    sys.stderr.write(run.stderr)
    print(run.stdout)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError as e:
        sys.exit(f"shardmix-doctor --json printed no JSON object: {e}")
    check_fields(report, {"providers": list, "rdma_devices": list, "shmem_huge_pages": str, "choice": dict,
                          "self_tests": list, "passed": bool}, "report")
    if not report["providers"]:
        sys.exit("report: no provider with FI_EP_RDM and RMA reads listed")
    for i, provider in enumerate(report["providers"]):
        check_fields(provider, PROVIDER_FIELDS, f"providers[{i}]")
    check_fields(report["choice"], CHOICE_FIELDS, "choice")
    if not report["self_tests"]:
        sys.exit("report: no self-test ran")
    for i, test in enumerate(report["self_tests"]):
        if not test.get("passed"):
            sys.exit(f"self_tests[{i}] ({test.get('requested')}) failed: {test.get('error')}")
        check_fields(test, SELF_TEST_FIELDS, f"self_tests[{i}]")
        if test["bytes_checked"] <= 0:
            sys.exit(f"self_tests[{i}]: no bytes compared")
        for j, sample in enumerate(test["bandwidth"]):
            check_fields(sample, BANDWIDTH_FIELDS, f"self_tests[{i}].bandwidth[{j}]")
    if not report["passed"]:
        sys.exit("report: passed is false")
    if run.returncode != 0:
        sys.exit(f"shardmix-doctor exited {run.returncode} although every self-test passed")


if __name__ == "__main__":
    main()
