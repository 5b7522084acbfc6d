# Stage 3: run each candidate on the same sequences and score it against the teacher in float64.


rule score:
    input:
        config=local(CONFIG_FILE),
        manifest="results/{run}/teacher/{kind}/{domain}/manifest.json",
        shards=lambda w: [
            f"results/{w.run}/teacher/{w.kind}/{w.domain}/shards/{i}.safetensors"
            for i in seq_ids(w.kind, w.domain)
        ],
    output:  # the candidates not in a fused pass (teacher.fused), i.e. all when it is off
        records=f"results/{{run}}/records/{{candidate,{SEPARATE_RE}}}/{{path}}/{{kind}}/{{domain}}/records.parquet",
        summary=f"results/{{run}}/records/{{candidate,{SEPARATE_RE}}}/{{path}}/{{kind}}/{{domain}}/score.json",
    log:
        "logs/{run}/score/{candidate}/{path}/{kind}/{domain}.log",
    benchmark:
        "benchmarks/{run}/score/{candidate}/{path}/{kind}/{domain}.tsv"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=240,
        gpu=0,
    params:
        device=device,
        launcher=launcher(),
    shell:
        "{params.launcher} score --config {input.config:q} --candidate {wildcards.candidate:q} --path {wildcards.path}"
        " --teacher results/{wildcards.run}/teacher/{wildcards.kind}/{wildcards.domain} --device {params.device}"
        " --out results/{wildcards.run}/records/{wildcards.candidate}/{wildcards.path}/{wildcards.kind}/{wildcards.domain}"
        " > {log:q} 2>&1"


if not FUSED:  # teacher.fused: the fused job scores the teacher against itself

    rule selfcheck:
        input:
            manifest="results/{run}/teacher/{kind}/{domain}/manifest.json",
            shards=lambda w: [
                f"results/{w.run}/teacher/{w.kind}/{w.domain}/shards/{i}.safetensors"
                for i in seq_ids(w.kind, w.domain)
            ],
        output:
            records="results/{run}/records/teacher-self/store/{kind}/{domain}/records.parquet",
            summary="results/{run}/records/teacher-self/store/{kind}/{domain}/score.json",
        log:
            "logs/{run}/selfcheck/{kind}/{domain}.log",
        benchmark:
            "benchmarks/{run}/selfcheck/{kind}/{domain}.tsv"
        threads: 1
        resources:
            mem_mb=4000,
            runtime=60,
        shell:
            "fideval score --self-check --teacher results/{wildcards.run}/teacher/{wildcards.kind}/{wildcards.domain}"
            " --out results/{wildcards.run}/records/teacher-self/store/{wildcards.kind}/{wildcards.domain} > {log:q} 2>&1"
