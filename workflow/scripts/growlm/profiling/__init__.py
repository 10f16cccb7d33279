"""Profiling: where a training step spends its time, by phase and by kernel.

* `ranges`: inside the training process, the named phase ranges (NVTX + torch.profiler) and the
  profiler's capture window, opened by the environment the driver sets;
* `tools`: finding Nsight Systems / Nsight Compute and probing whether they work here;
* `driver`: running a workload under a tool, falling back to torch.profiler, writing `run.json`;
* `exports`: each tool's export parsed into tidy frames; `tables`: one folder's tables (phases,
  kernels, summary, ncu metrics);
* `workload`: the workload of the workflow's profiling jobs (a few real training steps);
* `demo`: a tiny stand-alone workload for tests and probes.

Command line: `python -m growlm.profiling TOOL OUT_DIR [-- CMD...]` (see `driver`).
"""
