# Stage 3: run each candidate on the same sequences and score it against the teacher in float64.
# One job per (candidate, path, length) and one self-check per length score every domain in turn (DOMAIN_ARGS):
# each domain reads its own store and writes its own records folder.


rule score:
    input:
        config=local(CONFIG_FILE),
        stores=lambda w: store_inputs(w.run, w.kind),
    output:  # the candidates not in a fused pass (teacher.fused), i.e. all when it is off
        records=per_domain(
            "results/{run}/records/{candidate}/{path}/{kind}/{domain}/records.parquet"
        ),
        summary=per_domain(
            "results/{run}/records/{candidate}/{path}/{kind}/{domain}/score.json"
        ),
    log:
        "logs/{run}/score/{candidate}/{path}/{kind}.log",
    benchmark:
        "benchmarks/{run}/score/{candidate}/{path}/{kind}.tsv"
    wildcard_constraints:
        candidate=SEPARATE_RE,
    threads: 1
    resources:
        mem_mb=8000,
        runtime=240,
        gpu=0,
    params:
        device=device,
        launcher=launcher(),
        domains=DOMAIN_ARGS,
    shell:
        "{params.launcher} score --config {input.config:q} --candidate {wildcards.candidate:q} --path {wildcards.path}"
        " --teacher results/{wildcards.run}/teacher/{wildcards.kind}/{{domain}} --device {params.device} {params.domains}"
        " --out results/{wildcards.run}/records/{wildcards.candidate}/{wildcards.path}/{wildcards.kind}/{{domain}}"
        " > {log:q} 2>&1"


if not FUSED:  # teacher.fused: the fused job scores the teacher against itself

    rule selfcheck:
        input:
            stores=lambda w: store_inputs(w.run, w.kind),
        output:
            records=per_domain(
                "results/{run}/records/teacher-self/store/{kind}/{domain}/records.parquet"
            ),
            summary=per_domain(
                "results/{run}/records/teacher-self/store/{kind}/{domain}/score.json"
            ),
        log:
            "logs/{run}/selfcheck/{kind}.log",
        benchmark:
            "benchmarks/{run}/selfcheck/{kind}.tsv"
        threads: 1
        resources:
            mem_mb=4000,
            runtime=60,
        params:
            domains=DOMAIN_ARGS,
        shell:
            "fideval score --self-check --teacher results/{wildcards.run}/teacher/{wildcards.kind}/{{domain}} {params.domains}"
            " --out results/{wildcards.run}/records/teacher-self/store/{wildcards.kind}/{{domain}} > {log:q} 2>&1"
