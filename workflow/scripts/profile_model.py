"""Entry script of rules profile_nsys and profile_ncu."""
import json
import sys
from pathlib import Path

from growlm.jobs import job_log
from growlm.profile import profile_run
from growlm.tokenizer import load_tokenizer

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    out_dir = Path(sm.output.summary).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(sm.config))
    a, s = sm.params.args, sm.params.settings
    cmd = [sys.executable, "-m", "growlm.profile_workload", "--kind", a["kind"], "--config",
           str(out_dir / "config.json"), "--width", str(a["width"]), "--depth", str(a["depth"]),
           "--vocab", str(len(load_tokenizer(Path(sm.input.tokenizer).parent))), "--tokens", sm.input.tokens,
           "--steps", str(s["warmup_steps"] + s["steps"] + 1), "--threads", str(sm.threads)]
    if a["grown"]:
        cmd += ["--grown", a["grown"]]
    run = profile_run(sm.params.tool, cmd, out_dir, steps=s["steps"], warmup=s["warmup_steps"],
                      kernel_filter=s.get("ncu_kernel_filter"), launch_count=s["ncu_launch_count"])
    print(f"{sm.params.tool} requested; tables made by {run['profiler']}"
          + (f" (fallback: {run['fallback_reason']})" if run["fallback_reason"] else ""))
