"""The kinds a finding's `metrics["kind"]` takes where one rule's findings need different plans:
written by the rules, read by `trainprof try` (tryfix), which cannot import the rules."""

# dataloader-starvation: the loop waits for batches (or has no workers): more workers, prefetch
STARVATION = "starvation"
# dataloader-starvation: the workers keep up and the loop spends the time receiving batches
# (unpickling, mapping each tensor's shared memory): sharing strategy, pin_memory, no saving
# claimed on a CPU run
RECEIVING = "receiving"
# dataloader-starvation on a GPU run whose loader's workers fill the CPUs: the saving is an input
# pipeline's that keeps up, which no runtime change makes ("edit the code")
CPU_BOUND = "cpu-bound"
# launch-bound on a CPU run: per-op overhead, no saving claimed
CPU_OVERHEAD = "cpu-overhead"
