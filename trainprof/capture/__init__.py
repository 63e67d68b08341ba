"""`trainprof run`: runs a training script unmodified under torch.profiler.

Modules, one job each:

* command    the `run` command's options (the CLI and the torchrun worker parse them)
* runner     RunOptions, ScriptRun: checks the request, runs a Session, writes metadata, reports
* handoff    the CLI runs the script from its entry frame, not below typer/click and the runner
* distributed --nproc-per-node: every rank through torchrun, one folder, failures, merged report
* worker     `python -m trainprof.capture.worker`: torchrun's program, one rank under the engine
* children   ranks the script's framework starts itself: the start-up hook's environment, waiting
* child      run at start-up in those processes (startup/sitecustomize.py): profiles the ranks
* rankfiles  the ranks' metadata files in a run folder: which saved, which failed first
* session    one capture: installs everything, runs the script, saves, builds RunMeta (its
             start/stop halves are also trainprof.profile()'s with-block, see trainprof/api.py)
* launch     runs the script / -m module like python; exit codes; trimmed tracebacks
* notebook   `trainprof run nb.ipynb`: the code cells in order, IPython-only lines left out
* config     schedule and options: default.toml, --config, flags
* rundir     the run folder: default name, never overwritten without --force
* stepper    finds training steps (optimizer > backward > dataloader) and steps the profiler
* probes     trainprof/* record_function ranges: fetch, forward, backward, host reads
* metrics    TorchMetrics ranges and metadata, patched only if the script imports it
* evaluation trainprof/eval ranges: Lightning/HF evaluation loops, eval-mode no-grad forwards
* metadata   DataLoaders, optimizers, flags, environment -> RunMeta fields
* iterable_split whether an IterableDataset's code splits its samples between DataLoader
             workers, and a Hugging Face streaming dataset's shards (read, not run)
* repeats    the first batches of iterable datasets' loaders with workers: copies of earlier
             ones, as workers that each yield the whole stream give them
* dynamo     torch.compile over the whole run: compiles, recompiles (step, call, guard), breaks
* loadprobe  the machine's load over the run: load average, other processes' CPU time
* traces     the profiler and its trace files (tensorboard_trace_handler layout), each
             written when its window closes
* userprof   the script's own profiler: trainprof's steps aside before it starts; its traces
* cudaflags  --cuda-sync-events and --sync-debug, guarded on machines without CUDA
* cputime    CPU time of two alternatives run alternately, the least of each (the probes below)
* cpumath    bf16 vs fp32 conv/matmul speed on this CPU (for cpu-bf16), measured after the script
* modelprobe a copy of the user's model, fp32 vs the bf16 fix (cpu-bf16), and at the intra-op
             thread counts DataLoader workers would leave it (dataloader-starvation)
* loaderfetch a DataLoader worker forked from the loop, fetching the script's batches between
             its steps against the loop's fetch, and the loop's receiving of each batch
             handed back (dataloader-starvation)
* bf16fix    the bf16 autocast fix itself (channels-last for CNNs), shared with `trainprof try`
* optprobe   copies of the run's optimizer, loop vs fused/foreach, timed after the script
* noise      fd-level stderr filter: profiler noise to trainprof.log
* progress   the little trainprof shows on a terminal
* summary    step-time summary when no diagnosis is printed
* state      the flags every probe checks; disables everything in forked workers
* patching   reversible monkey-patching
* userframe  file:line of the first user-code frame
* sources    copies of the user's files as they ran (the script; the loop's stack's), in the
             run folder, for the diagnosis's alignment of frames already running
* compat     torch API differences across supported versions
"""
