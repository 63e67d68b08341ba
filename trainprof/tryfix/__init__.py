"""`trainprof try`: measures each fix instead of estimating it.

* command  reads the run folder, plans the variants, runs interleaved rounds, writes try.json
* round    `python -m trainprof.tryfix.round`: one run of the script, profiler off, fixes applied
* spawn    starting a round's process (a job's: through torchrun, or with the ranks hook); a
           job's ranks' results merged
* ranks    the ranks a round's script starts itself (Lightning's ddp, accelerate launch,
           torch.multiprocessing.spawn) run as rounds too
* apply    the fixes, patched in at runtime and reversibly (imports torch; only in a round)
* outputs  in a round, the script's own profiler writes no file, its checkpoints and logs go to
           the round's own folder (imports torch)
* apiblock a `trainprof.profile()` block in the script runs its code unprofiled in a round
* catalog  which rules have a runtime fix, their variants and their descriptions (torch-free)
* measure  saving with a two-level bootstrap interval over rounds and steps; the verdict
"""
