"""The workshop: attn-mt's benchmarks and GPU instruments, apart from the package they measure.

Each `scripts/bench_*.py`, `scripts/profile_step.py`, `scripts/read_trace.py` and
`scripts/gpu_check.py` is a short entry point that calls `main()` of its module here; the
modules import only public names of `attn_mt` and of each other. What they share:
- `common`: the machine's name, the matrix-product peak MFU is measured against, a timed
  window, peak memory, FLOPs of a step;
- `workload`: the WMT-shaped synthetic corpus and the configs of the sizes timed;
- `reference`: `torch.nn.Transformer` dressed as attn-mt's model;
- `steps`: the two steps timed, attn-mt's (the Trainer's own `UpdateStep`) and one plain step
  for what that update cannot run;
- `inductor`: Inductor settings from the command line, for the whole process.

This folder is not installed with attn-mt; the entry scripts put the repository on the path.
"""
