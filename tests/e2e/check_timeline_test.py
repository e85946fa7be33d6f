#!/usr/bin/env python3
"""check_timeline.py on a hand-made job: 2 daemons, 1 trainer each, 1 epoch of 2 batches
of 2 samples. The good trace passes; each kind of damage the e2e test must catch fails
with a message naming it."""
import copy
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_timeline  # noqa: E402

CSV_HEAD = 'epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner\n'
# trainer 0 (node 0): batch 0 = [4 local, 1 peer], batch 1 = [6 local, 3 peer]; trainer 1 (node 1): [0 peer, 5 local], [2 peer, 7 local]
ROWS = {0: [(0, 4, 'local'), (0, 1, 'peer'), (1, 6, 'local'), (1, 3, 'peer')],
        1: [(0, 0, 'peer'), (0, 5, 'local'), (1, 2, 'peer'), (1, 7, 'local')]}


def meta(pid, name, tids):
    out = [{'ph': 'M', 'name': 'process_name', 'pid': pid, 'tid': 0, 'args': {'name': name}}]
    out += [{'ph': 'M', 'name': 'thread_name', 'pid': pid, 'tid': t, 'args': {'name': f't{t}'}} for t in tids]
    return out


def good_trace():
    events = []
    for rank, rows in ROWS.items():
        pid = 1_000_000 + rank
        events += meta(pid, f'trainer {rank} (node {rank})', [1])
        t = 0.0
        for batch in (0, 1):
            ids = [s for b, s, _ in rows if b == batch]
            events.append({'ph': 'X', 'name': 'wait for batch', 'cat': 'trainer', 'pid': pid, 'tid': 1, 'ts': t,
                           'dur': 5.0, 'args': {'epoch': 0, 'batch': batch}})
            events.append({'ph': 'X', 'name': 'hold batch', 'cat': 'trainer', 'pid': pid, 'tid': 1, 'ts': t + 5,
                           'dur': 5.0, 'args': {'epoch': 0, 'batch': batch, 'size': 2, 'samples': ids}})
            t += 10
    for node in (0, 1):
        pid = 1 + node
        events += meta(pid, f'daemon {node}', [2, 101])
        for batch in (0, 1):
            events.append({'ph': 'b', 'name': f'read peer {1 - node}', 'cat': 'peer_read', 'pid': pid, 'tid': 2,
                           'ts': 1.0 + batch, 'id': f'0x{node}{batch}',
                           'args': {'peer': 1 - node, 'bytes': 100, 'samples': 1, 'epoch': 0, 'trainer': node,
                                    'batch': batch}})
            events.append({'ph': 'e', 'name': f'read peer {1 - node}', 'cat': 'peer_read', 'pid': pid, 'tid': 2,
                           'ts': 3.0 + batch, 'id': f'0x{node}{batch}'})
        events.append({'ph': 'X', 'name': 'wait for staging space', 'cat': 'daemon', 'pid': pid, 'tid': 101,
                       'ts': 0.5, 'dur': 0.2, 'args': {}})
        events.append({'ph': 'C', 'name': f'reads in flight, peer {1 - node}', 'pid': pid, 'tid': 0, 'ts': 1.0,
                       'args': {'reads': 1}})
        events.append({'ph': 'C', 'name': f'reads in flight, peer {1 - node}', 'pid': pid, 'tid': 0, 'ts': 4.0,
                       'args': {'reads': 0}})
    return {'traceEvents': events}


def find(trace, pid, name, batch=None):
    for e in trace['traceEvents']:
        if e['pid'] == pid and e.get('name') == name and (batch is None or e['args'].get('batch') == batch):
            return e
    raise KeyError(name)


class CheckTimelineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        for rank, rows in ROWS.items():
            with open(os.path.join(self.dir.name, f'rank-{rank}.csv'), 'w', encoding='utf-8') as f:
                f.write(CSV_HEAD)
                for pos, (batch, sample, tier) in enumerate(rows):
                    f.write(f'0,{rank},{batch},{pos},{sample},s{sample}.bin,0,100,0,{tier},0\n')

    def tearDown(self):
        self.dir.cleanup()

    def failures(self, trace, fraction=1.0):
        return check_timeline.check(trace, self.dir.name, 1, 2, 2, 1, fraction)[0]

    def assert_fails(self, trace, text, fraction=1.0):
        failures = self.failures(trace, fraction)
        self.assertTrue(any(text in f for f in failures), f'no failure mentioning {text!r} in {failures}')

    def test_good_trace_passes(self):
        self.assertEqual(self.failures(good_trace()), [])

    def test_a_sample_held_twice_fails(self):
        trace = good_trace()
        find(trace, 1_000_001, 'hold batch', 1)['args']['samples'] = [2, 4]
        self.assert_fails(trace, 'held more than once')
        self.assert_fails(trace, 'missing [7], extra [4]')

    def test_a_missing_hold_fails(self):
        trace = good_trace()
        trace['traceEvents'].remove(find(trace, 1_000_000, 'hold batch', 1))
        self.assert_fails(trace, 'delivered (2 samples) but not in the trace')

    def test_a_hold_without_its_wait_fails(self):
        trace = good_trace()
        trace['traceEvents'].remove(find(trace, 1_000_000, 'wait for batch', 1))
        self.assert_fails(trace, 'with no wait for it before')

    def test_overlapping_holds_fail(self):
        trace = good_trace()
        find(trace, 1_000_000, 'hold batch', 0)['dur'] = 50.0
        self.assert_fails(trace, 'overlaps')

    def test_a_read_completing_before_its_post_fails(self):
        trace = good_trace()
        end = next(e for e in trace['traceEvents'] if e['ph'] == 'e' and e['pid'] == 1)
        end['ts'] = 0.1
        self.assert_fails(trace, 'before its post')

    def test_peer_samples_must_match_the_trainers(self):
        trace = good_trace()
        begin = next(e for e in trace['traceEvents'] if e['ph'] == 'b' and e['pid'] == 2)
        begin['args']['samples'] = 2
        self.assert_fails(trace, 'peer reads carried 3 samples')

    def test_reads_in_flight_must_end_at_zero(self):
        trace = good_trace()
        trace['traceEvents'][-1]['args']['reads'] = 1
        self.assert_fails(trace, 'ends at 1, not 0')

    def test_sampling_must_keep_exactly_the_hashed_batches(self):
        # At a fraction that drops some of these batches, the full trace holds dropped ones.
        fraction = 0.2
        kept = [check_timeline.keep(0, r, b, fraction) for r in (0, 1) for b in (0, 1)]
        self.assertIn(False, kept, 'pick a fraction that drops one of the 4 batches')
        self.assert_fails(copy.deepcopy(good_trace()), 'although the sampling drops it', fraction)

    def test_expected_staging_waits_must_be_there(self):
        trace = good_trace()
        self.assertEqual(check_timeline.check(trace, self.dir.name, 1, 2, 2, 1, 1.0, True)[0], [])
        trace['traceEvents'] = [e for e in trace['traceEvents'] if e.get('name') != 'wait for staging space']
        failures = check_timeline.check(trace, self.dir.name, 1, 2, 2, 1, 1.0, True)[0]
        self.assertTrue(any('no staging wait traced' in f for f in failures), failures)

    def test_keep_matches_the_recorder_at_the_edges(self):
        self.assertTrue(check_timeline.keep(3, 1, 9, 1.0))
        self.assertFalse(check_timeline.keep(3, 1, 9, 0.0))


if __name__ == '__main__':
    unittest.main()
