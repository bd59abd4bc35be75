"""bench/peers/peer_timing.py: how the PyTorch peers time their training steps, written once.

    seconds_per_step, last = time_steps(step, warmup, steps, torch.cuda.synchronize)

runs `warmup` untimed steps, waits for the GPU (and for `ready`, such as a barrier of the other
processes, when given), then times `steps` steps up to the GPU's end of the last one. `last` is what
the last timed step returned (its loss). The scripts import it from their own folder.
"""
import time


def time_steps(step, warmup, steps, synchronize, ready=None):
    for _ in range(warmup):
        step()
    synchronize()
    if ready is not None:
        ready()
    t0 = time.perf_counter()
    last = None
    for _ in range(steps):
        last = step()
    synchronize()
    return (time.perf_counter() - t0) / steps, last
