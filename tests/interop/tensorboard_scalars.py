#!/usr/bin/env python3
"""Reads a fasttrain run directory's TensorBoard event files with TensorBoard's own reader.

  python tests/interop/tensorboard_scalars.py RUN_DIR
prints {"tag": [[step, value], ...], ...} as JSON: what TensorBoard shows, after its own handling of
resumed runs (a SessionLog START at step s hides the earlier session's events from step s on).
Needs the `tensorboard` package (scripts/install-deps puts it in .venv).
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    # size_guidance 0: keep every scalar (the default samples 10,000 per tag at random).
    events = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0}, purge_orphaned_data=True)
    events.Reload()
    scalars = {tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    print(json.dumps(scalars))


if __name__ == "__main__":
    main()
