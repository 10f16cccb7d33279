# What needs the network, fetched in one run where there is one (`snakemake --cores all prepare`, with
# the experiment's --configfile), so that the rest of the workflow runs where there is none (compute
# nodes; growlm.hub): every Hub dataset of corpus.sources read into the experiment's results, every
# Hub member of members.pretrained imported (its files stay in the Hub's cache, HF_HOME), and the
# documents of every benchmark task of evaluate.tasks loaded into that cache. Nothing here trains.


def prepare_targets():
    """The outputs whose jobs read the network: Hub sources, Hub members, task data."""
    out = [
        res(f"corpus/sources/{source['name']}/source.json")
        for source in config["corpus"]["sources"]
        if source.get("hf") and not Path(str(source["hf"])).is_dir()
    ]
    out += [
        f"{PRETRAINED.format(member=i + 1)}/model.safetensors"
        for i, item in enumerate(PRETRAINED_MEMBERS)
        if pretrained_spec(item)["kind"] == "hf"
    ]
    out += [res(f"tasks/data/{tid}.json") for tid, spec in TASKS.items() if not spec.get("bundled")]
    return out


rule prepare:
    input:
        prepare_targets(),
    run:
        print(
            f"growlm: prepared {len(input)} input(s) that need the network; run the rest anywhere that shares "
            f"results/ and the Hub's cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')}), with "
            "HF_HUB_OFFLINE=1 where there is no network",
            file=sys.stderr,
        )


# A benchmark task's documents, loaded once as lm-evaluation-harness loads them (into the Hub's cache).
rule fetch_task_data:
    output:
        res("tasks/data/{task}.json"),
    log:
        res("logs/fetch_task_data/{task}.log"),
    wildcard_constraints:
        task="|".join(re.escape(t) for t in TASKS) or "(?!)",
    conda:
        "../envs/growlm.yaml"
    params:
        spec=lambda wc: TASKS[wc.task],
    script:
        "../scripts/fetch_task_data.py"
