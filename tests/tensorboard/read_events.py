#!/usr/bin/env python3
"""Reads the trainer's --tensorboard-dir with TensorBoard's own event reader and checks it against
the same run's --log-jsonl: every iteration's "lm loss", "learning-rate" and "grad-norm" equal the
JSONL values rounded to float32, and every validation loss is there.

    read_events.py <tensorboard-dir> <metrics.jsonl>

Prints one line per tag (count, first and last value) and the tensorboard version; exits 1 on a
mismatch, 2 when the tensorboard package is missing."""
import json
import struct
import sys


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    try:
        import tensorboard
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        print(f"the tensorboard package is needed: {e}")
        return 2
    acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    print(f"tensorboard {tensorboard.__version__}: tags {sorted(tags)}")
    rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    train = {r["iteration"]: r for r in rows if "loss" in r}
    valid = {r["iteration"]: r["validation_loss"] for r in rows if "validation_loss" in r}
    bad = 0
    for tag, key in [("lm loss", "loss"), ("learning-rate", "lr"), ("grad-norm", "grad_norm")]:
        if tag not in tags:
            print(f"MISSING tag {tag}")
            bad += 1
            continue
        events = acc.Scalars(tag)
        got = {e.step: e.value for e in events}
        want = {i: f32(r[key]) for i, r in train.items()}
        wrong = [i for i in want if got.get(i) != want[i]]
        print(f"{tag}: {len(events)} events, steps {min(got)}..{max(got)}, {events[0].value:.6g} -> {events[-1].value:.6g}; "
              f"{len(wrong)} differ from the JSONL")
        bad += len(wrong) + (len(got) != len(want))
    if valid:
        got = {e.step: e.value for e in acc.Scalars("lm loss validation")} if "lm loss validation" in tags else {}
        wrong = [i for i in valid if got.get(i) != f32(valid[i])]
        print(f"lm loss validation: {len(got)} events; {len(wrong)} differ from the JSONL")
        bad += len(wrong)
    for tag in ["throughput (tokens/s)", "consumed-samples"]:
        if tag not in tags:
            print(f"MISSING tag {tag}")
            bad += 1
    print("tensorboard events: OK" if bad == 0 else f"tensorboard events: {bad} problems")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
