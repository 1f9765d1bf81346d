#!/usr/bin/python3
"""scripts/check-history on hand-made histories: each kind of loss, a double
application behind a lost ack, a missing start line, a torn line.  Each case
gives the files of a history directory and what the checker must say.

    tests/unit/test_check_history.py [CHECKER]

CHECKER defaults to scripts/check-history.  Exits 1 when a case fails.
"""
import os
import subprocess
import sys
import tempfile

CHECKER = sys.argv[1] if len(sys.argv) > 1 else "scripts/check-history"

# Worker 0 (incarnation 7) pushes seq 1.. to shard 0.  Epochs: 100, 200, 300.
CASES = [
    # name, files, expected exit, strings the output must hold
    ("clean run: restart from Redis holds every acknowledged update", {
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n"
                        "start 200 2 2 redis\n"
                        "apply 200 3 3 0 7 3\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 2 applied\n"
                            "ack 0 200 7 3 3 applied\n",
    }, 0, ["lost 0; applied twice 0", "history: ok"]),
    ("lost: an applied ack above the next start's journal", {
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n"
                        "start 200 1 1 redis\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 2 applied\n",
    }, 1, ["lost 1;", "lost: worker 0 incarnation 7 seq 2", "history: FAILED"]),
    ("lost: a duplicate ack whose original was rolled back", {
        # seq 2 applied by 100, its ack lost; 200 starts below it; the
        # resend is wrongly called a duplicate, so the update is gone.
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n"
                        "start 200 1 1 redis\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 200 7 2 1 duplicate\n",
    }, 1, ["lost 1;", "lost: worker 0 incarnation 7 seq 2", "history: FAILED"]),
    ("lost: a checkpoint load below an applied push", {
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n"
                        "start 100 1 0 chief\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 2 applied\n",
    }, 1, ["lost 1;", "history: FAILED"]),
    ("lost: a fenced incarnation's late application is not in the new line", {
        # 100 applies seq 2 at journal 2 after 200 started from Redis at 1;
        # the new line goes on to journal 3, which must not count as holding it.
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\n"
                        "start 200 1 1 redis\n"
                        "apply 100 2 2 0 7 2\n"
                        "apply 200 2 2 1 9 1\napply 200 3 3 1 9 2\n"
                        "start 300 3 3 redis\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 200 7 2 3 duplicate\n",
        "worker-1.history": "ack 0 200 9 1 2 applied\nack 0 200 9 2 3 applied\n",
    }, 1, ["lost 1;", "lost: worker 0 incarnation 7 seq 2", "history: FAILED"]),
    ("applied twice behind a lost ack: one applied ack at the worker", {
        # seq 2's ack from 100 was lost; 200 holds it and applies the resend again.
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n"
                        "start 200 2 2 redis\n"
                        "apply 200 3 3 0 7 2\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 200 7 2 3 applied\n",
    }, 1, ["applied twice 1", "twice: worker 0 incarnation 7 seq 2", "history: FAILED"]),
    ("not twice: the first application was rolled back before the resend", {
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n"
                        "start 200 1 1 redis\n"
                        "apply 200 2 2 0 7 2\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 200 7 2 2 applied\n",
    }, 0, ["lost 0; applied twice 0", "history: ok"]),
    ("missing start line: an incarnation acknowledged pushes without one", {
        # 200 restarted from a state below seq 2's version, but wrote no
        # start line: it must not count as an incarnation that lost nothing.
        "ps-0.history": "start 100 0 0 seed\n"
                        "apply 100 1 1 0 7 1\napply 100 2 2 0 7 2\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 2 applied\n"
                            "ack 0 200 7 3 2 applied\n",
    }, 1, ["no start line for shard 0 incarnation 200", "history: FAILED"]),
    ("unrecorded: an applied ack the shard never recorded applying", {
        "ps-0.history": "start 100 0 0 seed\napply 100 1 1 0 7 1\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 2 applied\n",
    }, 1, ["unrecorded 1;", "unrecorded: worker 0 incarnation 7 seq 2", "history: FAILED"]),
    ("a duplicate of a push refused as stale is no update", {
        "ps-0.history": "start 100 0 0 seed\napply 100 1 1 0 7 1\nstale 100 0 7 2\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 1 stale\n"
                            "ack 0 100 7 2 1 duplicate\n",
    }, 0, ["history: ok"]),
    ("torn line: a history cut mid-line", {
        "ps-0.history": "start 100 0 0 seed\napply 100 1 1 0 7 1\nchief 5 CUT 17",
        "worker-0.history": "ack 0 100 7 1 1 applied\n",
    }, 2, ["ps-0.history:3: torn line 'chief 5 CUT 17'"]),
    ("unreadable: a history that is not a file", {
        "ps-0.history": "start 100 0 0 seed\napply 100 1 1 0 7 1\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\n",
        "worker-1.history/": "",
    }, 2, ["worker-1.history: cannot read"]),
    ("an unknown line is bad input", {
        "ps-0.history": "start 100 0 0 seed\napply 100 1 1 0 7 1\n",
        "worker-0.history": "ack 0 100 7 1 1 applied\nack 0 100 7 2 2 maybe\n",
    }, 2, ["worker-0.history:2: unexpected line"]),
    ("no acknowledged push at all", {
        "ps-0.history": "start 100 0 0 seed\n",
    }, 1, ["history: FAILED (no acknowledged push"]),
]


def run(name, files, code, wants):
    with tempfile.TemporaryDirectory() as d:
        for f, text in files.items():
            if f.endswith("/"):
                os.mkdir(os.path.join(d, f))
                continue
            with open(os.path.join(d, f), "w") as fh:
                fh.write(text)
        p = subprocess.run([CHECKER, d], capture_output=True, text=True)
    out = p.stdout + p.stderr
    missing = [w for w in wants if w not in out]
    if p.returncode != code or missing:
        print(f"FAIL: {name}: exit {p.returncode} (expected {code})"
              + (f", missing {missing}" if missing else ""))
        for line in out.strip().splitlines()[-6:]:
            print(f"    {line}")
        return False
    print(f"ok: {name}")
    return True


def main():
    results = [run(*c) for c in CASES]
    print(f"check-history: {sum(results)} of {len(results)} cases pass ({CHECKER})")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
