# The noise floor (config report.noise_floor): the reference run again under a harmless change (another
# micro-batch) and scored against itself, per length and domain; `fideval report --noise-floor` reads it.
# No rule here unless the config asks for it (noise_dirs() is then empty and nothing requests these files).
# As for the teacher and score rules, one job per length runs every domain (DOMAIN_ARGS), each into its own folder.


rule teacher_noise:
    input:
        config=local(CONFIG_FILE),
        tokens=lambda w: f"results/{w.run}/windows/{w.kind}-{W if w.kind == 'windows' else C}/tokens.safetensors",
        meta="results/{run}/windows/eval-windows.json",
    output:
        manifests=per_domain(
            "results/{run}/teacher-noise/{kind}/{domain}/manifest.json"
        ),
    log:
        "logs/{run}/teacher-noise/{kind}.log",
    benchmark:
        "benchmarks/{run}/teacher-noise/{kind}.tsv"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=240,
        gpu=0,
    params:
        device=device,
        launcher=launcher(),
        micro_batch=NOISE_MICRO_BATCH,
        domains=DOMAIN_ARGS,
    shell:
        "{params.launcher} teacher --config {input.config:q} --windows {input.tokens:q}"
        " {params.domains} --device {params.device} --micro-batch {params.micro_batch}"
        " --out results/{wildcards.run}/teacher-noise/{wildcards.kind}/{{domain}} > {log:q} 2>&1"


rule score_noise:
    input:
        reference=per_domain("results/{run}/teacher/{kind}/{domain}/manifest.json"),
        other=per_domain("results/{run}/teacher-noise/{kind}/{domain}/manifest.json"),
    output:
        records=per_domain(
            "results/{run}/records/noise-floor/store/{kind}/{domain}/records.parquet"
        ),
        summary=per_domain(
            "results/{run}/records/noise-floor/store/{kind}/{domain}/score.json"
        ),
    log:
        "logs/{run}/score-noise/{kind}.log",
    benchmark:
        "benchmarks/{run}/score-noise/{kind}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        domains=DOMAIN_ARGS,
    shell:
        "fideval score --teacher results/{wildcards.run}/teacher/{wildcards.kind}/{{domain}} {params.domains}"
        " --candidate results/{wildcards.run}/teacher-noise/{wildcards.kind}/{{domain}} --name noise-floor"
        " --out results/{wildcards.run}/records/noise-floor/store/{wildcards.kind}/{{domain}} > {log:q} 2>&1"
