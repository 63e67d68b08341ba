"""dataloader-starvation: the training loop waits for the next batch.

Why it costs: with `num_workers=0` the main process decodes and augments every batch itself,
so nothing runs on the GPU (or, on a CPU run, no training happens) while it does. With too few
workers, or CPU-heavy transforms, the workers cannot keep up and the loop still waits.

Detection: `enumerate(DataLoader)#..._DataLoaderIter.__next__` (and trainprof's `trainprof/fetch`
probe) clipped to the step windows: the fetch time per step and its share of the step. Steps that
hold an evaluation pass (Lightning validation between two optimizer steps: its whole validation set
is fetched there) are not step windows (analysis/context), so their fetches never count. Whether the
loader already has workers comes from the run metadata, else from the iterator's class
(`_SingleProcessDataLoaderIter` means `num_workers=0`).

Waiting vs receiving (a loader that has workers): a fetch is then the loop WAITING for a batch no
worker has handed over yet (the Python frames `selectors.py: select` under the data queue's poll,
or `threading.py: wait` on the pin-memory thread's queue) and the loop RECEIVING one that is there
(the rest: unpickling it, mapping each tensor's shared memory, torch/multiprocessing/reductions.py
rebuild_storage_fd with a socket hand-shake with the worker per tensor, sending the next indices).
More workers remove only the waiting, so only the waiting is starvation: its share of the fetch
(the receiving's profiled time with the profiler's per-event cost taken out, analysis/unprofiled:
the profiler inflates that Python-heavy part, not the time blocked in a system call) times the
fetch share. On an H100 run with 4 workers that keep up, the loop waited 13 µs per step in a 1.36
ms profiled fetch. Where the receiving alone takes RECEIVE_SHARE of the step or more, the finding
says so instead ("Receiving batches from DataLoader workers takes X % of the step"): on a GPU,
pin_memory=True moves it to the pin-memory thread while the GPU works, and its saving is the GPU
idle while receiving (at most: that thread still needs the interpreter's lock; so at most medium
severity); on a CPU nothing is claimed. Fewer tensors per batch, or torch's `file_system`
sharing strategy (no socket hand-shake per tensor), cut it: try_fakedata with 2 workers, 4.3 vs
0.6 ms per step receiving on a quiet 2-core machine.
The finding's `metrics["kind"]` says which it is: "starvation" (waiting, or no workers) or
"receiving"; a receiving finding's saving of 0 is no claim (`trainprof try` shows its estimate as
not estimated and measures the sharing strategy, and pin_memory=True on a GPU, not more workers).
A trace without Python frames (with_stack=False) cannot tell the two apart: the whole fetch
counts, as for a loader without workers, and the evidence says so.

Saving estimate: on a GPU trace, the GPU idle time that falls inside fetches (the waiting part of
them with workers), never more than the fetch share. Where the run timed its fetches outside the
profiler (trainprof run: every step), the saving is stated for the fetch without the profiler,
which inflates a Python-heavy fetch far more than the GPU's work (num_workers=0 on an H100: 92 % of
the traced step, 85 % unprofiled, 86 % measured by the fix; with 4 workers 16 % traced, 2.2 %
unprofiled). A fetch idles the GPU only once the work queued before it has run: each traced step's
lead is its fetch less the GPU idle in it, the least taken, and each unprofiled step's fetch costs
what outlasts it; the saving is the median unprofiled step less the median of those steps without
what the fix takes off (analysis/loader_workers). With workers the loop waits and then receives,
the waiting's share of the fetch as above: more workers leave the receiving to outlast the lead (a
waiting finding's saving), a pin-memory thread the waiting (a receiving finding's). Where the run
did not time its fetches, the traced idle is taken as a fraction of the fetch's part (waiting,
receiving) and applied to the unprofiled one. The count to suggest on a GPU: enough workers for one
batch per step of the loop's own work (its step less the waiting); a loader with n workers the loop
waits for hands over one batch per step between them, so a batch takes a worker n unprofiled steps,
and each count of `trainprof try`'s sweep gets its own estimate from that (`gpu_saving_by_workers`;
as many workers or fewer save nothing). A ratio took one slow fetch for every step: an H200 run's
window held a 40.4 ms fetch (30.8 ms of GPU idle) between two of 6.2-6.7 ms that idled it 0.08 ms,
and the DataLoader came first at 8.5 %, where its unprofiled fetches took 3.9 ms (one in 50 over 10
ms); now 0.1 %, as two runs of the script without such a fetch said (0.2 % on the H200, 1.4 % on an
H100). On a GPU the saving is also held to the idle of the unprofiled step (analysis/gpu_headroom),
as every fix of the host's side.
On a CPU trace the workers take the fetch off the loop, but:
- the fetch and the step are taken without the profiler, which inflates a Python-heavy fetch
  several times over (136 ms profiled vs 33 ms unprofiled in one run): the medians over the
  run's unprofiled steps of the step time S and of the time spent in fetches F (trainprof times
  both at every step; older metadata: the fetch's share of the traced step with the profiler's
  per-event cost taken out, analysis/unprofiled). The model's compute is M = S - F.
- each batch crosses a process boundary: measured after the run on this machine for batches of the
  script's shapes (capture/loaderipc), the main process pays R per batch to receive it and a
  worker W to hand it over. For tiny samples this costs more than the fetch it saves. A shared
  VM's speed moves by up to 1.7x in stretches of 10 ms to seconds, and the saving is about F - R,
  two figures timed apart: the Hugging Face Trainer's example estimated 14 % (F 4.0 ms in five
  steps of a slow stretch, 2.1-2.9 ms in the twenty before; R 2.8 ms) where `trainprof try`
  measured -0.5 %, and 0 % in an identical run. So a fixed piece of work (Python between small
  tensor ops, about 0.1 ms) is timed at the step boundaries after the profiling window
  (capture/phaseref), and each of the steps S and F come from is divided by the reference beside
  it (the mean of its two boundaries) over the run's typical reference (the median over all its
  boundaries): S' and F' are their medians at the run's typical speed (analysis/phase). R and W
  are taken as the typical speed's: hand-overs between processes move much less with this
  process's speed (in 24 paired samples the busy receiving took 1.22x as long in the slow
  stretches as in the fast ones, the reference 1.65x), and scaling them by the reference beside
  the probe moved the Hugging Face Trainer's R from 2.0 to 3.2 ms in a run whose probe fell in a
  fast stretch. The model's figures are stated at the steps' speed, pace = S / S': F' pace, R
  pace, W pace (the evidence gives the pace where it is 5 % off 1). Fewer than 5 such steps (older
  metadata): pace 1, F as timed.
- fewer intra-op threads slow the model: M ran with the run's T threads, the fix leaves T'.
  Timed on the run's own steps: after the profiling window the run alternates T with one and
  C - 1, C - 2 threads for 8 rounds (capture/threadsteps; those steps are left out of S and F),
  and M(T') = M x m(T') / m(T), linear in 1/T between the counts (Amdahl's law is linear
  there): m(T') / m(T) is the median over the steps with T' threads of each one's step minus its
  fetch over that of the steps with T on either side of it (a machine that slows down during the
  block moves a step and its neighbours alike: the Hugging Face Trainer's example, the ratio's
  5-95 % spread over resamples 0.91-1.49 as the ratio of each count's median, 1.08-1.20
  paired). The block's first step is left out: the first after the profiling window, where the
  profiler stops and the worker below is forked, 39-56 ms against 10-16 in the rest of that
  example's block in six runs. The step itself, not a part
  of it: Lightning's example, M 2.7-3.5 ms with 2 threads and 3.5-4.2 with one in seven runs,
  where a copy of the model's forward and backward (below) scaled all of M by its own ratio
  (1.45-1.68) to 5.3-6.1 ms, leaving the estimate at 0-4 % against 22-28 % measured; the
  optimizer's updates scale with threads too, the framework's Python does not. Where the
  script ended before the block (or set its own thread count in it): a copy of the model,
  forward and backward on its last batch, timed after the run with each count
  (capture/modelprobe.thread_times, the least of up to 50 interleaved runs each), t(T') / t(T)
  in place of m. try_fakedata's CNN: 5.6 ms
  with 2 threads, 8 ms with one. Neither (no training call kept, a compiled model): M(T') = M.
- a worker's fetch is not the loop's: it runs one intra-op thread (torch sets it there), and its
  stack is deeper (code that formats the stack pays per frame: FakeData seeds torch for every
  sample, and on a CUDA build with CUDA not initialised torch.manual_seed queues a lazy CUDA seed
  with the formatted stack; under `trainprof run` try_fakedata's loop fetched a batch in 21.5 ms
  and a real worker in 31.2, timed by hand). So from the end of the profiling window a DataLoader
  worker forked in the loop's fetch (as the script's own would fork: from the loop's stack, not a
  "bad fork" to torch, which skips that seed; capture/cudacheck) fetches one of the script's
  batches at step boundaries (outside the step times) while the loop waits, each paired with the
  loop's own fetch in the step just ended, after steps with the run's thread count only (beside
  the thread steps, then after them), up to 12 pairs, the first after the fork left out
  (capture/loaderfetch); the workers' F is the loop's times the median ratio (at least 1: below is
  noise). The loop's steps are slower while the worker is there and for a few steps after (a 0.4
  ms step: 0.45-0.55 ms, 0.36-0.40 after and without): left out of the step statistics
  (RunMeta.worker_fetch_steps). Five
  workloads, 30-step runs: try_fakedata 1.17-1.30 (three runs; the estimate 34.5-38.8 % where
  it was 40-41 %, `trainprof try` measuring 23-27 % in earlier runs), Lightning's example
  1.07-1.13 (still high in three runs), dataloader_starved 1.16-1.17, try_jpeg 1.28,
  try_threaded_fetch 1.51-1.53. try_fakedata's was 1.48-1.49 once its worker forked as the
  script's would (two 60-step runs; estimates 20.2 and 17.3 %, `try` +21.2 and +28.1 %), and has
  been 1.35-1.40 since it forks in the loop's fetch (two more: 23.6 and 20.5 % against +21.1 and
  +22.3 %).
  Where the pairs did not run (off with `worker_fetch = false`, the script ended first, an
  iterable dataset), the thread steps' one thread also time the fetch, and their ratio stands
  in: a 384x384 matmul per sample (tests/scripts/try_threaded_fetch.py) fetched in 9.4 ms with
  2 threads and 15.0 ms with one.
- workers and the model's intra-op threads share the C cores: the fix runs n workers with
  torch.set_num_threads(T' = max(1, C - n)), and the fixed step is the largest of the loop's
  own work M(T') + k R (k fetches per step), the workers' rate (F h + k W) / n (h below), and
  all the CPU work spread over the cores, (M(T') min(T', C) + F h + k (W + R)) / C (R in full
  where n = C, below).
  Each n from 1 to C is tried and the best suggested. The saving is S minus that step.
  The metrics hold what solves the model again (analysis/loader_workers.step_with): M with the
  run's threads, M with each n's threads, F, R, W, k and C. `trainprof try` estimates each
  count of its sweep from them, and all fixes together with the others' savings taken off M (a
  faster model can leave the workers' rate the bound: many_problems, one worker and bf16
  autocast together measured +30.5 %, their estimates summed to 50.5 %, the model 30.6 %).
- evaluation passes: persistent workers go on fetching the training loader's batches while the
  loop evaluates, up to prefetch_factor batches each. Where the run's unprofiled steps hold two
  or more passes, a pass every E steps (the median gap) D longer than a plain step, n workers
  make b = min(D n / (F / k + W), prefetch_factor n, E k) batches meanwhile, and the workers'
  rate is (F + k W)(1 - b / (E k)) / n. The suggestion's prefetch_factor is 2; `trainprof try`
  solves its variants with its own, 4. The Lightning example (a pass every 20 steps, 72-91 ms
  over a step): one worker made its batches in 13.0 ms, the model's bound, with the passes
  turned off (its fetch 11.6 ms timed in the worker), and the training steps took 9.7-12.3 ms
  with them; its estimates, 20.8 % for one worker and 26.1 % for two against +38.7 % and
  +28.6 % measured, became 31.4 % for both.
  Only the workers' rate, not the cores' bound nor the loop's path: workers that keep ahead of
  the loop (their rate under the step) have their batches made when a pass starts, and it
  leaves them nothing to make. Lightning's example in the plain script (one thread, prefetch
  factor 4; the training iterator's queue read as each of one run's first 12 passes started
  and ended): two workers had 5-8 of their 8 batches made at the start (7-8 at the end), one
  worker 0-2 of 4 (4 at the end); the two workers' mean training step was 8.5-8.7 ms with the
  passes and 8.3-8.7 without them, one worker's 7.5-8.0 against 8.6-8.9. Taking the passes'
  batches off the cores too had put two workers at 33.1 % against +19.9 % measured (now
  18.0 %), 36.3 against +24.6 % (now 32.0 %) and 35.9 against +19.4 % (now 26.5 %) in three
  benchmarks; one worker, whose rate binds, 37.6 against +39.2 % and 35.9 against +35.5 % (now
  30.0 and 30.6 %: the cores' bound, (M(T') + F + k (W + R)) / C, binds there).
- iterators left before their end: a loader with workers keeps prefetch_factor batches per
  worker requested ahead, and where the script stops taking batches before the iterator's end
  (Lightning's limit_val_batches, a `break` out of an evaluation loop) the workers fetch them
  all the same, in the training steps after the pass (analysis/loader_cuts). The run records
  when each iterator started and how many batches each one replaced early still had; a loader
  cut c times per training step, L batches left each, costs the workers
  c min(prefetch_factor n, L) batches a step (F / k + W each: the evaluation's fetches are not
  timed apart), on the cores. Only for a loader without workers yet. Lightning's example (16
  evaluation batches cut at 8 every 20 steps, prefetch_factor 4): the median training step
  12.9-15.3 ms with one worker and 17.0-19.7 with two, against 11.5-12.5 and 12.1-13.3 where
  the passes took all 16 batches; `trainprof try` measured two workers 13 points below one in
  two benchmarks where the model gave both the same step (39.9 %, two measuring +30.0 %). With
  the cuts: 35.9 % for both, measured +40.3 % and +32.7 % (without them 42.2 and 48.2 %).
  An evaluation loader among them (most of its iterators made with autograd off, as Lightning's
  validation loop and a `with torch.no_grad():` loop make them, and built at a line of the
  script no other loader shares) gets prefetch_factor=1 in the fix, the suggestion's and
  `trainprof try`'s (which finds it by that line): c min(n, L) batches a step. The training
  loader keeps its prefetch_factor: one cut each epoch (limit_train_batches) wastes little, and
  fewer batches in hand let the loop wait. Lightning's example, six alternated runs of each by
  hand, the median training step with the evaluation loader at 4 and at 1: one worker 7.4-12.9
  ms (median 10.4) against 7.8-10.0 (8.8); two 9.2-11.6 (10.8) against 9.0-11.5 (10.5), the
  workers' CPU 1.21-1.26 against 1.05-1.12 cores.
- a worker fetching batch after batch keeps its caches warm, where the forked worker above
  fetches one batch between two of the loop's steps, cold, as the loop's own fetch is. So in
  each pause it fetches the next batch straight after the timed one (capture/loaderfetch), and
  h is the median of each pause's second fetch over its first, at most 1: F h is a worker's
  work per batch, in the workers' rate and in the cores' bound alike. Until 2026-12-01 h was
  taken in the rate only, where each worker has a core of its own (n < C), the workers on full
  cores (n = C) taken to share them with the model's threads cold; the kept benchmark runs of
  stops 57-63 (36 runs of 12 workloads) diagnosed again with h everywhere put 60 of 70 worker
  counts within target or the right call instead of 57 (try_fakedata's two workers within it in
  all five runs, three under before; none out that was in), the mean error of two workers +2.4
  points against +1.0 (docs/fix-efficacy.md, stop 63). Before, one worker's estimate ran 6.8
  points under the measurement on average over 17 benchmark runs (benchmarks/rediagnose_try.py),
  the step measured a median 0.88 of the worker's rate bound; by hand a second batch straight
  after the first took 0.93-0.98 of it. The runs' h on another VM (2026-11-29, stop 48):
  0.96-0.98 on six workloads, 0.93 on the Hugging Face example; one worker's estimate moved up
  1.1-3.1 points where the workers' rate bound it (try_jpeg 10.8 to 13.9 % against +11.0 %
  measured, quickstart 20.4 to 22.6 against +24.8, many_problems 35.1 to 36.6 against +33.7,
  dataloader_starved 32.3 to 33.4 against +28.3). On that VM those four were not low before
  (a mean error of +0.2 points, +2.2 after; all within target both ways): the fix's worker also
  shares the last-level cache and memory with the loop's model, which neither probe fetch sees.
- not modelled: that two processes on two vCPUs may not get twice one's throughput (SMT
  siblings, a host's other guests). try_fakedata's fix measured a 21.8 ms step where the cores'
  bound said 17.9 (`trainprof try`). In a plain script on a quiet VM, two workers spent 22-33 ms
  of CPU per batch where one spent 22-24, in runs a minute apart, and two spinning processes
  got 1.14-1.29 times one's throughput then, 1.30-1.90 half an hour before. Measuring that
  during the run was tried (a second forked process fetching beside the timed worker) and left
  out: a figure that moves so between minutes would make the estimate, and its severity, move
  with it between identical runs.
  Nor the workers' start-up (once per run with persistent_workers=True; given in the
  evidence); nor other processes' load: the cores are taken as the run's own (the evidence says
  when other processes kept half a CPU or more busy during the run), and on a machine whose
  cores other jobs share fewer threads can make the model faster, not slower (threads that
  wait for a descheduled peer): `trainprof try` measures the thread change alone beside it.
  The model takes M(T') as at least M where T' is at most the run's count: one-thread steps
  faster than their neighbours are the machine moving between steps (the Hugging Face example:
  0.84x two threads in one run of three, 1.05-1.07 in the others, the estimate 25.3 % where
  `try` has measured +6 to +17 %; 13.4 % now), and such a saving would not be the fix's.
The spread: the saving is about F - R - (M(T') - M), a difference of figures each timed on a few
steps or batches. So the model is also computed on RESAMPLES (400) resamples of the run's own
samples, seeded: its unprofiled steps (S and F, with their references), each thread count's
paired ratios, the probe's busy receives (each of its 9 batches is kept) and the run's own, and
the pairs of the worker forked between the steps (each one's ratio to the loop's fetch: where one
worker barely keeps up, their median decides its estimate; try_fakedata's 8-12 pairs gave
medians of 1.41-1.61, 1.20-1.57 and 1.13-1.40 over resamples in three runs). The 5th and 95th
percentiles are the finding's `saving_lo_pct` and `saving_hi_pct`, given in the evidence and
beside the estimate in `trainprof try`; each worker count's, `saving_lo_by_workers` and
`saving_hi_by_workers`, go beside the model's estimate for that count in `try`'s sweep. The
severity stays the estimate's: taken from the low end, it flipped Lightning's example between
low and high in four identical runs (the low end 0-25.3 % where the estimates were 11.9-27.3 %,
high in all four by the estimate, `trainprof try` measuring 12.9-28 % in the benchmarks), as the
5th percentile of a few samples moves more than their median. It does not cover what moves
between runs: the Hugging Face Trainer's example gave 0 to 14.9 % (high in one run, info in
others) in identical runs one session, each spread 5-19 points wide and not overlapping (the
machine moved between them), and 0 % in all sixteen runs of the next. Where the spread crosses a
severity line, the evidence says so ("That spans low to medium: an identical run may rate it
either way"): on a 2-core Zen 3 VM that example's estimate was 0.2-8.5 % in ten runs (`medium`
eight times, `low` twice), `trainprof try` measuring +4.5 to +8.7 %.
With workers already (n0 of them), only the waiting part of F leaves the loop (the receiving
stays in its M = S minus the waiting), and the loop's fetch says nothing of the workers' work: a
batch is not there because every worker is still making one, so they spend n0 S of their time
per step between them, hand-overs included (R is in M, W in that time, both 0 in the model),
at the run's sharing of the cores; their wait for a core counts as work, so on the cores' bound
the estimate errs low. The fixed quickstart example (one worker, one thread; a 39.8 ms step,
11.3 ms of it waiting): taking the waiting as the worker's work put two workers at 28.5 ms
(28.2 %); n0 S puts them at 34.2 ms (14.1 %, the cores' bound). `trainprof try` measured
+17.4 % against 17.9 % and +15.0 against 16.1 % in two benchmarks (fixed malloc thresholds),
and +6.1 to +8.5 % against 14.1-16.9 % in three runs by hand, with glibc's own: these make the
script's processes fault in several times as many pages, which cost two workers on full cores
about 2 ms a step in the plain script and one worker nothing, so the run with one cannot show
it (docs/fix-efficacy.md, stop 49). Where the n0 workers and the model's threads fill the
cores, more workers would not pay off, and the fix says so.
With num_workers=0, R is the probe's receiving while workers are busy fetching
(capture/loaderipc, receive_busy_ms): a worker busy decoding answers the per-tensor hand-shake
late (its resource-sharer thread waits for the interpreter's lock, or for
a core): try_fakedata with 2 workers, 4.1 ms per batch in the loop against 1.2 ms from an idle
worker on a quiet 2-core machine, 7.9 against 1.6 ms on a loaded one. R is on the loop's own
path (M + k R), and in full in the cores' bound. Only its CPU work (the idle worker's figure)
was counted there before, as if the loop, blocked on the hand-shake, left its core to the
workers. Measured in the fixed loops (a plain script with two workers and one thread, 105
steps): the loop's thread spent 0.8-1.0 ms of CPU in next() per step, against 3.1-5.3 ms of
wall, and the cores idled all the same, 1.6 ms per step (3.1 %) in try_fakedata's and 2.4 ms
(10.8 %) in try_jpeg's. With only the CPU work, the bound was under the fixed step `trainprof
try` measured on 6 of 7 rows of two benchmarks where the cores bound it (1.10x on average;
1.04x with R in full), and try_fakedata's estimate was 36.2 % against 25.7 % measured (31.8 %
with R in full). Older metadata: R = the idle figure.
That holds where the fix's workers and the model's threads fill the cores (n = C). The probe
times the busy receiving with min(2, C) workers fetching flat out beside the loop, on two cores
three busy processes, so its excess over the idle figure is partly the wait for a core. A fix
that leaves each process a core of its own (n < C: one worker and one thread on two) does not
meet that wait, and the loop's wait on the hand-shake leaves its core to nobody: the cores'
bound takes the loop's own R there, as its path does. Lightning's example with one worker
(prefetch_factor 4, one thread, its validation every 20 steps; a plain script, five runs): the
mean training step 7.5-8.0 ms (median 7.3-7.5), the loop using 0.59-0.61 of a core and the
workers 1.0 (its validation loader's worker among them) in the two runs that counted; without
the validation (two runs) 8.6-8.9 ms, the worker's CPU 8.5-8.9 ms a step (busy throughout),
where its rate bound is 8.6 ms. The cores' bound with R in full was 9.2 ms (8.4 with the
passes' batches taken off it, which the model no longer does: above), with the loop's R 8.0.
Its estimate, 27.4 % against +39.2 % measured, became 37.6 % with this change alone and 30.0 %
with the passes' (stop 52's folders; docs/fix-efficacy.md, stop 53).
The receiving where the workers keep ahead, timed in the run: the probe's figures come seconds
after the steps, and on this VM the hand-over moved with the machine's speed more than the
reference says. The Hugging Face example's steps ran 10.6 ms with the probe's receiving at 1.97
ms: an estimate of 2.1 % where `trainprof try` measured +12-14 % (its fast blocks 10.2 against
11.6 ms); the Trainer's loop with one worker, run by hand at that speed, received a batch in
1.1-1.2 ms, and at the slower speed in 1.6-2.2 ms against the probe's 1.5-2.2 in the same
process and minute. So the worker that times the script's fetch between the steps
(capture/loaderfetch) hands each of its batches back as a fix's worker would, and the loop's
receiving of it, once it is there, is timed (up to 12 batches, the worker idle, as a worker
that keeps ahead is when the loop takes its batch): their median is R on the loop's own path
(M + k R). On the cores the receiving from busy workers counts: the probe's busy figure times
the run's receiving over the probe's own timed the same way after the run (each batch after a
wait as long as the run's fetch, `receive_waited_ms`), at least the run's. Where the run timed
fewer than 3 (a batch of other types than tensors, arrays and plain values in containers is not
handed back), both are the probe's as before. On the Hugging Face example in a slow stretch:
7.7 % with the probe's R 1.90 ms, 9.7 % with the run's 1.61; quickstart 37.7 and 38.3 %;
try_fakedata, its workers the bound, 25.9 and 25.7 %.
Without step times in the metadata (a bare trace) the saving is F, an upper bound, and said so.
The suggested `num_workers` on a GPU is the number of workers needed to produce one batch per
compute-only step (fetch time / compute time, rounded up, plus one; from the steps without the
profiler where the run timed them), at least 2, capped by the CPUs less the one the loop itself
needs: the rank's share of them where the job runs several ranks on the machine (torchrun's and
accelerate's LOCAL_WORLD_SIZE, or a rendezvous on 127.0.0.1: 8 ranks on 32 CPUs leave 4 each,
so 3 workers; Lightning's `suggested_max_num_workers` divides the same way). Where the cap
binds, n workers hand a batch over every F / n and the loop still waits F / n - C per step, so
the saving counts only the rest, F - (F / n - C), and the evidence says so. Where the loader
already has as many workers as that cap, or more, more workers make no more batches, but the
GPU idles through the waiting all the same: the finding (its `metrics["kind"]` "cpu-bound")
says the input pipeline is CPU-bound and claims the waiting's GPU idle, the cost of the pipeline
itself: what one that keeps up (less CPU work per batch: augmentation on the GPU, NVIDIA DALI,
decoded samples cached; or more CPUs) would take off, at most. It was reported as info with no
saving before, below findings that cost the GPU far less. `trainprof try` cannot make that
change: it lists the finding as one to edit, with its estimate, and sweeps no worker counts.

An IterableDataset (analysis/loader_streams): each worker runs the dataset's whole `__iter__`,
so workers split its samples only where its code asks `get_worker_info()` which worker it is
(capture/iterable_split reads the code; a `worker_init_fn` or a torch DataPipe count too).
Where nothing is seen to, two or more workers would each run all of it, and a stream read from
data (files, a list; not random draws, which workers are seeded apart for) would yield every
sample once per worker: the fix then says how to split it first (its estimate is the split
stream's; one worker needs no split). A Hugging Face `datasets` streaming dataset gives each
worker whole shards (files) and stops the workers beyond its `num_shards`: the suggestion stops
there, and where that few workers fetch no faster than the loop, the fix is more shards first.
"""

from __future__ import annotations

import os

from trainprof.analysis import loader_cuts, loader_streams
from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import run_fix
from trainprof.analysis.kinds import CPU_BOUND, RECEIVING, STARVATION
from trainprof.analysis.loader_workers import (
    SUGGESTED_PREFETCH,
    CpuModel,
    Estimate,
    estimate,
    fetches_in_steps,
    workers,
)
from trainprof.analysis.model import Finding, severity_for
from trainprof.rules import INPUT, Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv

MIN_SHARE = 5.0  # % of the step below which fetching is not worth a finding
# % of the step spent receiving batches from workers that keep up, from which that is a finding
# of its own (the IPC cost more workers cannot remove): twice MIN_SHARE, since the receiving
# without the profiler is an estimate (its profiled time, the profiler's per-event cost out).
RECEIVE_SHARE = 2 * MIN_SHARE
BUSY_CPUS = 0.5  # CPUs other processes kept busy during the run from which the evidence says so
PACE_SAYS = 0.05  # the probe's figures scaled by this much or more: the evidence says so
WORKER_FETCH_SAYS = 1.05  # a worker's fetch this much slower than the loop's: the evidence says so
WARM_SAYS = 0.01  # a worker's warm fetch this much faster than its cold one: the evidence says so


def _cpu_evidence(
    model: CpuModel, cores: int, threads: int, others: float | None, has_workers: bool = False
) -> str:
    where = (
        "the run's steps outside the profiler" if model.measured
        else "the traced steps, the profiler's overhead taken out"
    )
    text = (
        f" Without the profiler ({where}) a step takes {ms(model.step)}, {ms(model.fetch)} of it "
        f"fetching."
    )
    startup = (
        f" (workers start in {model.startup_ms:.0f} ms, once per run when persistent)"
        if model.startup_ms is not None else ""
    )  # fmt: skip
    if model.receive_in_run:
        text += (
            f" Timed between the run's steps, the loop took {ms(model.receive)} to receive one of "
            f"the script's own batches from a worker. Measured here after the run, a worker hands "
            f"over a batch like these in {ms(model.worker)}{startup}, and while "
            f"{max(model.busy_workers, 1)} worker(s) fetch the next ones the loop's receiving "
            f"takes {ms(model.receive_busy)} (the probe's figure, brought to the steps' moments by "
            f"the same receiving timed after the run)."
        )
    elif model.receive or model.worker:
        text += (
            f" Measured here after the run, a worker hands over a batch like these in "
            f"{ms(model.worker)} and the loop takes {ms(model.receive)} to receive it"
        )
        if model.busy_workers:
            text += (
                f" while {model.busy_workers} worker(s) fetch the next ones "
                f"({ms(model.receive_idle)} from an idle worker)"
            )
        text += f"{startup}."
    elif has_workers:  # the probe runs only for loaders without workers
        text += " The cost of handing batches between processes is in those times already."
    else:
        text += " The cost of handing batches between processes was not measured (older run)."
    if (model.receive or model.worker) and abs(model.pace - 1) >= PACE_SAYS:
        text += (
            f" These are stated at the speed of the steps above: a fixed piece of work took "
            f"{model.pace:.2f}x as long beside them as it typically did in this run."
        )
    threads_text = (
        f" and torch.set_num_threads({model.threads})" if model.threads < threads else ""
    )
    if threads_text and model.run_threads:
        how = "a copy of the model timed after the run with both"
        if model.threads_source == "steps":
            how = (
                f"timed on {model.thread_steps} of the run's steps run with fewer threads after "
                "the profiled window, interleaved with steps with its own"
            )
            if model.thread_blocks > 1:
                how += (
                    f", in {model.thread_blocks} blocks over {model.thread_span_s:.0f} s of the run"
                )
        text += (
            f" The rest of the step, {ms(model.step - model.removable)} with {threads} threads, "
            f"would take about {ms(model.compute)} with {model.threads} ({how})."
        )
    slower = model.worker_fetch > WORKER_FETCH_SAYS * model.removable
    if model.worker_fetch_source == "workers":
        text += (
            f" The loop waits for its {model.run_workers} worker(s): a batch is not there "
            f"because each is still making one, so they spend {ms(model.worker_fetch)} per step "
            f"between them ({model.run_workers}x the step, hand-overs included), their work at "
            "this run's sharing of the cores."
        )
    elif slower:
        if model.worker_fetch_source == "worker":
            text += (
                f" A DataLoader worker forked from the loop, fetching the script's own batches "
                f"between its steps, took {model.worker_fetch / model.removable:.2f}x the loop's "
                f"fetch just before each: {ms(model.worker_fetch)} of a worker's work per step."
            )
        else:
            text += (
                f" The fetch itself took {ms(model.worker_fetch)} in those steps with one "
                f"thread, as a worker runs it, against {ms(model.removable)} with {threads}: a "
                "worker's work per batch."
            )
    if model.warm <= 1 - WARM_SAYS:
        who = (
            "It" if slower and model.worker_fetch_source == "worker"
            else "A DataLoader worker forked from the loop"
        )  # fmt: skip
        text += (
            f" {who} fetched a batch straight after one taken between the run's steps in "
            f"{model.warm:.2f}x the time: a worker of the fix fetches batch after batch, its "
            "caches warm."
        )
    if model.eval_every:
        text += (
            f" The run evaluates every {model.eval_every:.0f} steps, a pass "
            f"{ms(model.eval_extra)} longer than a step: persistent workers that fall behind "
            f"fetch the training batches ahead meanwhile, up to prefetch_factor "
            f"({SUGGESTED_PREFETCH}) each, which shortens their rate (workers that keep ahead "
            "have theirs made when a pass starts)."
        )
    text += _cuts_evidence(model)
    text += (
        f" With {cores} cores shared by the workers and the model's threads, "
        f"{model.workers} worker(s){threads_text} would make the step about {ms(model.fixed)}"
    )
    if threads_text and not model.run_threads:
        text += " (the thread change's own effect on the model was not measured)"
    text += "."
    if model.spread is not None and model.saving > 0:
        lo, hi = model.spread
        pairs = " and the worker's fetches" if model.worker_fetch_source == "worker" else ""
        text += (
            f" Within this run's own noise (its steps, the thread steps, the probe's receives"
            f"{pairs} resampled) the saving is {lo:.1f}-{hi:.1f} % (5th to 95th percentile)."
        )
        low, high = severity_for(lo), severity_for(hi)
        if low != high:  # the severity is the estimate's; say where an identical run may land
            text += f" That spans {low} to {high}: an identical run may rate it either way."
    if others is not None and others >= BUSY_CPUS:
        text += (
            f" Other processes kept {others:.1f} of the {cores} CPUs busy during the run: the "
            "workers would get less than the cores assumed here, and every figure of this run "
            "moves with that load."
        )
    return text


def _cuts_evidence(model: CpuModel) -> str:
    """The loaders the script leaves before their end, and what their unused batches would
    cost the workers (analysis/loader_cuts)."""
    if not model.cuts:
        return ""
    cut = max(model.cuts, key=lambda c: c.per_step)
    where = f" built at {os.path.basename(cut.location)}" if cut.location else ""
    left = f", {cut.left} batches before its end" if cut.left >= 0 else " before its end"
    others = (f" (and {len(model.cuts) - 1} other loader(s) likewise)"
              if len(model.cuts) > 1 else "")
    text = (f" Every {1 / cut.per_step:.0f} steps the script stops taking batches from the "
            f"DataLoader{where}{left}{others}: its workers would still fetch the batches they "
            "had requested ahead, prefetch_factor x num_workers at most.")
    cost = (f"{ms(model.waste)} of the workers' time per step with {model.workers} worker(s), "
            "counted on the cores")
    if cut.evaluation:
        return (f"{text} The fix gives that evaluation loader prefetch_factor="
                f"{loader_cuts.EVAL_PREFETCH}, one batch a worker: {cost}.")
    return (f"{text} At the suggested prefetch_factor ({SUGGESTED_PREFETCH}): {cost} (a smaller "
            "prefetch_factor for that loader wastes less).")


def _evaluation_fix(model: CpuModel | None, workers: int) -> str:
    """The fix's line for the evaluation loaders the script leaves before their end
    (analysis/loader_cuts.evaluation_fix), empty without."""
    places = loader_cuts.evaluation_locations(model.cuts) if model is not None else []
    if not places:
        return ""
    return (f"\n{loader_cuts.evaluation_fix(workers, places)}: the script leaves its iterators "
            "before their end")


def _threads_line(model: CpuModel | None, threads: int | None) -> str:
    """The fix's line that leaves the model the threads the workers do not need (empty where it
    keeps the run's)."""
    if model is None or not threads or model.threads >= threads:
        return ""
    return f"\ntorch.set_num_threads({model.threads})  # workers and model share the cores"


def _multiprocess(ctx: Context, n_workers: int | None) -> bool:
    """Whether the loader has worker processes (known from the metadata or the iterator)."""
    if n_workers is not None:
        return n_workers > 0
    return any("_MultiProcessing" in ctx.trace.name(int(i)) for i in ctx.dataloader_idx)


def _split_evidence(est: Estimate) -> str:
    """The waiting / receiving split of a fetch with workers, for the evidence."""
    split = est.split
    if split is None:
        return (
            " The trace holds no Python frames (with_stack=False): the wait for workers and the "
            "loop's own receiving of batches cannot be told apart, so all of the fetch counts."
        )
    return (
        f" Of the fetch, the loop waits for a worker {ms(split.wait)} per traced step and "
        f"receives batches (unpickling, mapping shared memory, sending indices) {ms(split.receive)}"
        f"; without the profiler, which inflates the receiving, that is {est.wait:.1f} % of the "
        f"step waiting and {est.receive:.1f} % receiving. More workers take only the waiting off."
    )


def _receive_finding(
    ctx: Context, est: Estimate, n_workers: int | None, fetch: float, loc: str | None,
    metrics: dict,
) -> Finding:
    """Workers keep up, but the loop spends RECEIVE_SHARE or more of the step receiving batches
    from them: IPC cost that more workers do not remove."""
    have = f"workers (num_workers={n_workers})" if n_workers is not None else "workers"
    pinned = bool(ctx.meta and any(d.pin_memory for d in ctx.meta.dataloaders))
    moves = []
    if ctx.on_gpu and not pinned:
        moves.append(
            "DataLoader(..., pin_memory=True) receives batches on the pin-memory thread, while "
            "the GPU works"
        )
    moves += [
        'torch.multiprocessing.set_sharing_strategy("file_system") maps each tensor by name '
        "instead of a socket hand-shake with the worker per tensor",
        "fewer tensors per batch (stack samples into one tensor; uint8 images normalised on "
        "the device) and fewer, larger batches cut the per-batch cost",
    ]
    saving = est.receive_saving if ctx.gpu_timeline and not pinned else 0.0
    # `trainprof try` reads the kind (its fix is not more workers) and a receiving saving of 0
    # as no claim (tryfix/command.py).
    metrics = {**metrics, "kind": RECEIVING}
    evidence = (
        f"Fetching batches takes {ms(fetch)} per traced step, {est.share:.1f} % of the step"
        + (" without the profiler" if est.plain is not None else "")
        + f", but the {have} keep up: the loop hardly waits for them."
        + _split_evidence(est)
    )
    if saving:
        evidence += " The saving is the GPU idle while the loop receives (an upper bound: the "
        evidence += "pin-memory thread still needs the interpreter's lock)."
    # An upper bound is never ranked high: what the pin-memory thread takes off is not measured.
    severity = "medium" if ctx.pct(saving) >= 3.0 else None
    return finding(
        ctx,
        rule="dataloader-starvation",
        title=f"Receiving batches from DataLoader workers takes {est.receive:.0f} % of the step",
        severity=severity,
        evidence=evidence,
        fix="; ".join(moves) + ".",
        saving_us_per_step=saving,
        location=loc,
        metrics=metrics,
        at=ctx.dataloader_idx[ctx.in_windows(ctx.dataloader_idx)].tolist(),
    )


def _cpus_here(ctx: Context, cpus: int) -> str:
    """The fix line's comment on the CPUs the count was capped by."""
    meta = ctx.meta
    if meta and meta.cpu_count and cpus < meta.cpu_count:
        shared = f"{meta.cpu_count} shared by {meta.local_world_size} ranks"
        return f"{cpus} CPUs per rank here: {shared}"
    return f"{cpus} CPUs here"


def _too_few_evidence(ctx: Context, est: Estimate, cpus: int | None) -> str:
    """Where the CPUs allow fewer workers than one batch per compute-only step needs."""
    here = f"{_cpus_here(ctx, cpus)}; one left to the loop" if cpus else "8 at most"
    text = (f" One batch per compute-only step would take {est.need} workers; the fix suggests "
            f"{est.suggest} ({here})")
    if est.left_wait > 0 and ctx.gpu_timeline:
        text += (f", which still leave the loop waiting about {ms(est.left_wait)} per step"
                 " (the saving counts only the rest)")
    return text + "."


def check(ctx: Context) -> list[Finding]:
    if not len(ctx.dataloader_idx) or ctx.device.kind == "mtia":
        return []
    in_steps = iv.intersect(ctx.dataloader_spans, ctx.windows)
    fetch = ctx.per_step(iv.total(in_steps))
    fetches = fetches_in_steps(ctx)
    k = fetches / max(ctx.n_steps, 1)
    # This rank's share of the machine's CPUs where the job runs several on it
    cpus = ctx.meta.cpus_per_rank() if ctx.meta else None
    threads = ctx.meta.torch_threads if ctx.meta and ctx.meta.torch_threads else None
    n_workers = workers(ctx)
    est = estimate(ctx, fetch, k, cpus, threads, _multiprocess(ctx, n_workers), n_workers)
    share, saving, model, suggest = est.share, est.saving, est.model, est.suggest
    # The GPU idle inside the traced fetches (the saving is its part in the waiting, scaled to
    # the fetch without the profiler where the run timed it).
    idle = ctx.per_step(iv.total(ctx.attribution["dataloader"])) if ctx.gpu_timeline else 0.0
    loc = None
    if ctx.meta and ctx.meta.dataloaders:
        loc = ctx.meta.dataloaders[0].location
    loc = loc or ctx.location(int(ctx.dataloader_idx[0]))
    metrics = {
        "fetch_ms_per_step": round(fetch / 1000, 3),
        "fetches_per_step": round(k, 2),
        "share_pct": round(share, 2),
        "gpu_idle_ms_per_step": round(idle / 1000, 3),
        "num_workers": -1 if n_workers is None else n_workers,
        "suggested_num_workers": suggest,
    }
    if est.by_workers:
        metrics["gpu_saving_by_workers"] = est.by_workers
    if est.split is not None:
        metrics.update(
            wait_ms_per_step=round(est.split.wait / 1000, 3),
            receive_ms_per_step=round(est.split.receive / 1000, 3),
            wait_pct=round(est.wait, 2),
            receive_pct=round(est.receive, 2),
        )
    if est.starving < MIN_SHARE and ctx.pct(saving) < 2.0:
        if est.split is not None and est.receive >= RECEIVE_SHARE:
            return [_receive_finding(ctx, est, n_workers, fetch, loc, metrics)]
        return []
    evidence = (
        f"Fetching batches takes {ms(fetch)} per step = {ctx.pct(fetch):.1f} % of the traced step "
        f"({fetches} fetches in {ctx.n_steps} steps)"
    )
    if ctx.gpu_timeline:
        evidence += f"; the GPU is idle for {ms(idle)} of it per step."
        if est.plain is not None and ctx.unprofiled_step_us:
            evidence += (
                f" Without the profiler (the run's steps outside it) a step takes "
                f"{ms(ctx.unprofiled_step_us)}, {ms(est.plain)} of it fetching."
            )
    else:
        evidence += "; on CPU that time is not spent training."
        if model is not None:
            load = ctx.meta.load if ctx.meta else None
            evidence += _cpu_evidence(model, cpus or 1, threads or 1,
                                      load.other_cpus if load else None, bool(n_workers))
        else:
            evidence += " Upper bound: the core count or the step without the profiler is unknown."
    full = est.full  # on a GPU, the CPUs allow no more workers than the loader has
    if est.need and not full:
        evidence += _too_few_evidence(ctx, est, cpus)
    if _multiprocess(ctx, n_workers):
        evidence += _split_evidence(est)
    if est.worker_batch:
        evidence += (
            f" The {n_workers} workers hand a batch over per step between them: without the "
            f"profiler each takes about {ms(est.worker_batch)} for one, against "
            f"{ms(est.loop_own)} of the loop's own work per step"
            + (f", so {est.suggest} would keep up." if not est.left_wait else
               f"; {est.need} would keep up, more than the {cpus} CPUs here allow beside the "
               "loop." if full else ".")
        )
    loaders = ctx.meta.dataloaders if ctx.meta else []
    unsplit = loader_streams.unsplit(loaders)
    shards = est.held_by_shards
    if shards is not None:
        evidence += loader_streams.shard_note(shards)
    # More workers would not pay off: the CPU model says so, or on a GPU the CPUs allow no more
    # than the loader has (they make no more batches)
    no_gain = (model is not None and model.saving <= 0) or (model is None and full)
    # On a GPU the waiting idles it all the same: that is the CPU-bound pipeline's cost, which
    # no runtime change takes off (`try` lists it to edit)
    cpu_bound = no_gain and est.pipeline > 0
    if no_gain and n_workers == 0 and shards is not None:
        title = (f"DataLoader fetching takes {share:.0f} % of the step, but the dataset's "
                 f"{shards} shard(s) feed too few workers")
        fix = loader_streams.reshard_fix(shards)
    elif no_gain and n_workers == 0:
        title = (
            f"DataLoader fetching takes {share:.0f} % of the step, but workers would not pay off"
        )
        whole = ("yield whole batches from the dataset's __iter__ (DataLoader(batch_size=None))"
                 if any(d.iterable for d in loaders) else
                 "index whole batches at once (a BatchSampler as `sampler=` with batch_size=None)")
        fix = (
            "Keep num_workers=0: handing each batch between processes costs more than fetching "
            f"it. Make the fetch itself cheaper: {whole}, or fewer, larger batches."
        )
    elif n_workers == 0 or n_workers is None and "_SingleProcess" in ctx.trace.name(
        int(ctx.dataloader_idx[0])
    ):
        title = f"DataLoader starves the step: num_workers=0, {share:.0f} % of step time fetching"
        fix = (
            f"DataLoader(..., num_workers={suggest}, persistent_workers=True, prefetch_factor=2"
            + (", pin_memory=True)" if ctx.on_gpu else ")")
            + (f"  # {_cpus_here(ctx, cpus)}" if cpus else "")
        )
        fix += _threads_line(model, threads)
        fix = run_fix(ctx, "dataloader", fix, workers=suggest, pin=ctx.on_gpu)
        fix += _evaluation_fix(model, suggest)
        if unsplit and suggest > 1:
            fix += loader_streams.unsplit_fix(unsplit, suggest)
    else:
        have = f"num_workers={n_workers}" if n_workers is not None else "worker processes"
        title = f"DataLoader starves the step despite {have}: {share:.0f} % fetching"
        if est.split is not None:
            title = (
                f"DataLoader starves the step despite {have}: {est.wait:.0f} % of the step "
                "waiting for workers"
            )
        lighter = (
            "move augmentation to the GPU (torchvision.transforms.v2 on device tensors, NVIDIA "
            "DALI), or cache decoded samples."
        )
        fix = ("The input pipeline is CPU-bound: raise num_workers up to the core count, "
               f"persistent_workers=True; {lighter}")
        if no_gain:
            title = (f"DataLoader starves the step despite {have}, but more workers would not "
                     "pay off")
            fill = (f"its workers and the model's threads fill the {model.cores} cores"
                    if model is not None else
                    f"more workers than the {cpus} CPUs here less one for the loop make no "
                    "more batches")
            fix = f"Keep {have}: {fill}. The input pipeline is CPU-bound: {lighter}"
            if cpu_bound:
                title = (f"DataLoader starves the GPU despite {have}: {est.wait:.0f} % of the "
                         "step waiting for a CPU-bound input pipeline")
                evidence += (
                    " The saving is the GPU idle of that waiting: what an input pipeline that "
                    "keeps up (less CPU work per batch, or more CPUs) would take off, at most. "
                    "No runtime change makes it: `trainprof try` lists it as a change to the code."
                )
                saving = est.pipeline
        elif model is None and est.worker_batch:
            fix = (f"DataLoader(..., num_workers={suggest}, persistent_workers=True)"
                   + (f"  # {_cpus_here(ctx, cpus)}" if cpus else ""))
            fix += f"\nBeyond that the input pipeline is CPU-bound: {lighter}"
            if unsplit:
                fix += loader_streams.unsplit_fix(unsplit, suggest)
        elif model is not None and model.workers > (n_workers or 0):
            fix = (f"DataLoader(..., num_workers={model.workers}, persistent_workers=True)"
                   + (f"  # {_cpus_here(ctx, cpus)}" if cpus else "")
                   + _threads_line(model, threads))
            fix += f"\nBeyond that the input pipeline is CPU-bound: {lighter}"
            if unsplit:
                fix += loader_streams.unsplit_fix(unsplit, model.workers)
    # The loop waits: more workers help (vs "receiving"), or the pipeline itself is the cost
    metrics["kind"] = CPU_BOUND if cpu_bound else STARVATION
    if model is not None:
        metrics.update(
            unprofiled_fetch_ms=round(model.fetch / 1000, 3),
            unprofiled_step_ms=round(model.step / 1000, 3),
            fixed_step_ms=round(model.fixed / 1000, 3),
            receive_ms_per_batch=round(model.receive / 1000, 3),
            receive_busy_ms_per_batch=round(model.receive_busy / 1000, 3),
            receive_in_run=int(model.receive_in_run),  # 1/0: R timed between the run's steps
            worker_ms_per_batch=round(model.worker / 1000, 3),
            # R and W as timed after the run times this: the steps' speed against the probe's
            pace=round(model.pace, 4),
            suggested_threads=model.threads,
            compute_ms_with_fix=round(model.compute / 1000, 3),  # M with the fix's threads
            worker_fetch_ms=round(model.worker_fetch / 1000, 3),  # a worker's fetch, one thread
            worker_warm_ratio=round(model.warm, 4),  # its fetch batch after batch over that
            # The estimate includes the thread change's effect on the model (timed on a copy):
            # `trainprof try` then checks it against the whole variant, not the workers' part.
            threads_modelled=int(bool(model.run_threads)),  # 1/0: metrics hold numbers
            # What re-solves the model for another worker count or with other fixes too
            # (analysis/loader_workers.step_with: `trainprof try`'s sweep and all fixes together)
            cores=model.cores,
            model_compute_ms=round(model.run_compute / 1000, 3),  # M with the run's threads
            compute_ms_by_workers=[round(c / 1000, 3) for c in model.compute_by_workers],
        )
        # Iterators the script leaves before their end: their workers' unused batches
        metrics.update(loader_cuts.to_metrics(model.cuts))
        if model.eval_every:  # the workers fetch ahead during the run's evaluation passes
            metrics.update(eval_every_steps=round(model.eval_every, 2),
                           eval_extra_ms=round(model.eval_extra / 1000, 3))
        if model.spread is not None:
            metrics.update(saving_lo_pct=round(model.spread[0], 2),
                           saving_hi_pct=round(model.spread[1], 2))
        if model.spread_by_workers:  # each worker count's (index n - 1): try's sweep
            metrics.update(
                saving_lo_by_workers=[round(lo, 2) for lo, _ in model.spread_by_workers],
                saving_hi_by_workers=[round(hi, 2) for _, hi in model.spread_by_workers])
    return [
        finding(
            ctx,
            rule="dataloader-starvation",
            title=title,
            evidence=evidence,
            fix=fix,
            saving_us_per_step=saving,
            location=loc,
            metrics=metrics,
            at=ctx.dataloader_idx[ctx.in_windows(ctx.dataloader_idx)].tolist(),
        )
    ]


RULE = Rule(
    id="dataloader-starvation",
    detects="The step waits for the DataLoader (num_workers=0, too few workers, slow transforms).",
    fix="num_workers>0, persistent_workers=True, pin_memory=True; lighter CPU transforms.",
    check=check,
    part=INPUT,
)
