"""One side of a round of turns without trainprof's round around it (tryfix/turns Turn), for
tests/test_try_turns.py: a helper process that writes the time every 2 ms, and steps of 3 ms of
busy work, each step's end time written down. `python turns_child.py GO_FD DONE_FD BLOCK STEPS
OUT`: OUT.steps and OUT.ticks get one time per line."""

import multiprocessing as mp
import sys
import time

from trainprof.tryfix.turns import Turn


def tick(path: str) -> None:
    with open(path, "a", buffering=1) as f:
        while True:
            f.write(f"{time.monotonic()}\n")
            time.sleep(0.002)


if __name__ == "__main__":
    go, done, block, steps, out = (*map(int, sys.argv[1:5]), sys.argv[5])
    helper = mp.get_context("fork").Process(target=tick, args=(out + ".ticks",), daemon=True)
    helper.start()
    count = 0
    turn = Turn(go, done, lambda: count, warmup=2, block=block)
    with open(out + ".steps", "w", buffering=1) as f:
        for _ in range(steps):
            start = time.monotonic()
            while time.monotonic() - start < 0.003:
                pass
            count += 1
            f.write(f"{time.monotonic()}\n")
            turn.after_step()
    helper.terminate()
