# Stage 2: FP32 teacher logits of the reference model, one store per (length, domain).
# One rule per length so that a deleted shard reruns only its own job and what reads it.
# threads: 1 — each job is one single-threaded torch process; two run side by side on two cores.

for _kind in [] if FUSED else ["windows", "cuts"]:

    rule:
        name:
            f"teacher_{_kind}"
        input:
            config=local(CONFIG_FILE),
            tokens=f"results/{{run}}/windows/{_kind}-{W if _kind == 'windows' else C}/tokens.safetensors",
            meta="results/{run}/windows/eval-windows.json",  # its tokenizer fingerprint is checked against the model's
            selftest="results/{run}/selftest.json",  # the runner agrees with transformers on this model
        output:
            manifest=f"results/{{run}}/teacher/{_kind}/{{domain}}/manifest.json",
            shards=shard_outputs(_kind),
        log:
            f"logs/{{run}}/teacher/{_kind}/{{domain}}.log",
        benchmark:
            f"benchmarks/{{run}}/teacher/{_kind}/{{domain}}.tsv"
        threads: 1
        resources:
            mem_mb=8000,
            runtime=240,
            gpu=0,
        params:
            kind=_kind,
            device=device,
            launcher=launcher(),
        shell:
            "{params.launcher} teacher --config {input.config:q} --windows {input.tokens:q}"
            " --domain {wildcards.domain} --device {params.device}"
            " --out results/{wildcards.run}/teacher/{params.kind}/{wildcards.domain} > {log:q} 2>&1"


# teacher.fused: the store, every emulated candidate's records and the self-check from one pass (`fideval fused`).
for _kind in ["windows", "cuts"] if FUSED else []:

    rule:
        name:
            f"fused_{_kind}"
        input:
            config=local(CONFIG_FILE),
            tokens=f"results/{{run}}/windows/{_kind}-{W if _kind == 'windows' else C}/tokens.safetensors",
            meta="results/{run}/windows/eval-windows.json",
            selftest="results/{run}/selftest.json",
        output:
            manifest=f"results/{{run}}/teacher/{_kind}/{{domain}}/manifest.json",
            shards=shard_outputs(_kind),
            records=[
                f"results/{{run}}/records/{c}/{p}/{_kind}/{{domain}}/{f}"
                for c, p in FUSED_PAIRS + [("teacher-self", "store")]
                for f in ("records.parquet", "score.json")
            ],
        log:
            f"logs/{{run}}/fused/{_kind}/{{domain}}.log",
        benchmark:
            f"benchmarks/{{run}}/fused/{_kind}/{{domain}}.tsv"
        threads: 1
        resources:
            mem_mb=8000,
            runtime=480,
            gpu=0,
        params:
            kind=_kind,
            device=device,
        shell:
            "fideval fused --config {input.config:q} --windows {input.tokens:q} --domain {wildcards.domain}"
            " --device {params.device} --out results/{wildcards.run}/teacher/{params.kind}/{wildcards.domain}"
            " --records results/{wildcards.run}/records > {log:q} 2>&1"
