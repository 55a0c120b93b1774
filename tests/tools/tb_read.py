"""Reads TensorBoard event files back with TensorBoard's own reader and prints the scalars
as JSON: {tag: [[step, value], ...]}. Usage: tb_read.py RUN_TB_DIR"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
out = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
print(json.dumps(out))
