# Stage 2: FP32 teacher logits of the reference model, one store per (length, domain).
# One job per length runs every domain (DOMAIN_ARGS, workflow/rules/common.smk): one process pays the imports once,
# and each domain keeps its own store folder and lock.
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
            manifests=per_domain(
                f"results/{{run}}/teacher/{_kind}/{{domain}}/manifest.json"
            ),
            shards=[f for d in DOMAINS for f in shard_outputs(_kind, d)],
        log:
            f"logs/{{run}}/teacher/{_kind}.log",
        benchmark:
            f"benchmarks/{{run}}/teacher/{_kind}.tsv"
        threads: 1
        resources:
            mem_mb=8000,
            runtime=240,
            gpu=0,
        params:
            kind=_kind,
            device=device,
            launcher=launcher(),
            domains=DOMAIN_ARGS,
        shell:
            "{params.launcher} teacher --config {input.config:q} --windows {input.tokens:q}"
            " {params.domains} --device {params.device}"
            " --out results/{wildcards.run}/teacher/{params.kind}/{{domain}} > {log:q} 2>&1"


# teacher.fused: the store, every emulated candidate's records and the self-check from one pass (`fideval fused`),
# one job per length running every domain in turn, as above.
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
            manifests=per_domain(
                f"results/{{run}}/teacher/{_kind}/{{domain}}/manifest.json"
            ),
            shards=[f for d in DOMAINS for f in shard_outputs(_kind, d)],
            records=[
                f"results/{{run}}/records/{c}/{p}/{_kind}/{d}/{f}"
                for d in DOMAINS
                for c, p in FUSED_PAIRS + [("teacher-self", "store")]
                for f in ("records.parquet", "score.json")
            ],
        log:
            f"logs/{{run}}/fused/{_kind}.log",
        benchmark:
            f"benchmarks/{{run}}/fused/{_kind}.tsv"
        threads: 1
        resources:
            mem_mb=8000,
            runtime=480,
            gpu=0,
        params:
            kind=_kind,
            device=device,
            domains=DOMAIN_ARGS,
        shell:
            "fideval fused --config {input.config:q} --windows {input.tokens:q} {params.domains}"
            " --device {params.device} --out results/{wildcards.run}/teacher/{params.kind}/{{domain}}"
            " --records results/{wildcards.run}/records > {log:q} 2>&1"
