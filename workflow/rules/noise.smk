# The noise floor (config report.noise_floor): the reference run again under a harmless change (another
# micro-batch) and scored against itself, per length and domain; `fideval report --noise-floor` reads it.
# No rule here unless the config asks for it (noise_dirs() is then empty and nothing requests these files).


rule teacher_noise:
    input:
        config=local(CONFIG_FILE),
        tokens=lambda w: f"results/{w.run}/windows/{w.kind}-{W if w.kind == 'windows' else C}/tokens.safetensors",
        meta="results/{run}/windows/eval-windows.json",
    output:
        manifest="results/{run}/teacher-noise/{kind}/{domain}/manifest.json",
    log:
        "logs/{run}/teacher-noise/{kind}/{domain}.log",
    benchmark:
        "benchmarks/{run}/teacher-noise/{kind}/{domain}.tsv"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=240,
        gpu=0,
    params:
        device=device,
        launcher=launcher(),
        micro_batch=NOISE_MICRO_BATCH,
    shell:
        "{params.launcher} teacher --config {input.config:q} --windows {input.tokens:q}"
        " --domain {wildcards.domain} --device {params.device} --micro-batch {params.micro_batch}"
        " --out results/{wildcards.run}/teacher-noise/{wildcards.kind}/{wildcards.domain} > {log:q} 2>&1"


rule score_noise:
    input:
        reference="results/{run}/teacher/{kind}/{domain}/manifest.json",
        other="results/{run}/teacher-noise/{kind}/{domain}/manifest.json",
    output:
        records="results/{run}/records/noise-floor/store/{kind}/{domain}/records.parquet",
        summary="results/{run}/records/noise-floor/store/{kind}/{domain}/score.json",
    log:
        "logs/{run}/score-noise/{kind}/{domain}.log",
    benchmark:
        "benchmarks/{run}/score-noise/{kind}/{domain}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "fideval score --teacher results/{wildcards.run}/teacher/{wildcards.kind}/{wildcards.domain}"
        " --candidate results/{wildcards.run}/teacher-noise/{wildcards.kind}/{wildcards.domain} --name noise-floor"
        " --out results/{wildcards.run}/records/noise-floor/store/{wildcards.kind}/{wildcards.domain} > {log:q} 2>&1"
