"""Ctrl-C while a trainer waits for a batch (ClientOptions::interrupted, decision 0036).

Run as the trainers of a job whose every batch waits for slow storage
(inject.storage_delay on samples no node caches, far longer than the 1 s before the SIGINT): the
KeyboardInterrupt must come out of the wait itself, before any batch, and leave
the connection closed (a later call says so), not after the batch arrives.
"""
import os
import signal
import sys
import threading

import shardmix

client = shardmix.Client()
rank = client.rank
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
batches = 0
try:
    for batch in client.epoch(0):
        batches += 1
    sys.exit(f"rank {rank}: the epoch ended ({batches} batches) without the KeyboardInterrupt")
except KeyboardInterrupt:
    pass
if batches != 0:
    sys.exit(f"rank {rank}: KeyboardInterrupt only after {batches} batches: the wait was not interrupted")
try:
    for batch in client.epoch(0):
        break
    sys.exit(f"rank {rank}: the client still works after the interrupt; its wait was not interrupted")
except shardmix.Error as e:
    after = str(e)
if "closed when a wait was interrupted" not in after:
    sys.exit(f"rank {rank}: unexpected error after the interrupt: {after}")
print(f"rank {rank}: KeyboardInterrupt out of the wait; then: {after}")
