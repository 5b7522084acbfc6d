# Stage 4: report.json with cluster-bootstrap intervals, plots, the model card, and the gates.


rule report:
    input:
        config=local(CONFIG_FILE),
        windows="results/{run}/windows/eval-windows.json",
        manifests=lambda w: teacher_manifests(w.run),
        records=lambda w: [f"{d}/records.parquet" for d in records_dirs(w.run)],
        selfcheck=lambda w: [f"{d}/records.parquet" for d in selfcheck_dirs(w.run)],
        noise=lambda w: [f"{d}/records.parquet" for d in noise_dirs(w.run)],
    output:
        report="reports/{run}/report.json",
        plots=report(
            directory("reports/{run}/plots"),
            patterns=["{name}.png"],
            category="Fidelity",
            caption="../report/plots.rst",
        ),
    log:
        "logs/{run}/report.log",
    benchmark:
        "benchmarks/{run}/report.tsv"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        # each declared file behind its option (the verb takes repeated --records, --self-check, --teacher-manifest)
        records=lambda w, input: " ".join(f"--records {f}" for f in input.records),
        selfcheck=lambda w, input: " ".join(
            f"--self-check {f}" for f in input.selfcheck
        ),
        manifests=lambda w, input: " ".join(
            f"--teacher-manifest {f}" for f in input.manifests
        ),
        noise=lambda w, input: " ".join(f"--noise-floor {f}" for f in input.noise),
    shell:
        "fideval report --config {input.config:q} --windows {input.windows:q} {params.records}"
        " {params.selfcheck} {params.manifests} {params.noise} --out reports/{wildcards.run} > {log:q} 2>&1"


rule compare:  # only where the config has several builds on a shared path (FAMILY, workflow/rules/common.smk)
    input:
        report="reports/{run}/report.json",
    output:
        comparison="reports/{run}/family/comparison.json",
        plot="reports/{run}/family/comparison.png",
    log:
        "logs/{run}/compare.log",
    benchmark:
        "benchmarks/{run}/compare.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        path=FAMILY[0] if FAMILY else "",
        length=FAMILY[1] if FAMILY else 0,
    shell:
        "fideval compare {input.report:q} --path {params.path} --length {params.length}"
        " --out reports/{wildcards.run}/family > {log:q} 2>&1"


rule card:
    input:
        report="reports/{run}/report.json",
        comparison=(["reports/{run}/family/comparison.json"] if FAMILY else []),
    output:
        card="reports/{run}/README.md",
        # the card's tables as a page of `snakemake --report`, beside the plots
        results=report(
            "reports/{run}/results.html",
            category="Fidelity",
            subcategory="Results",
            caption="../report/results.rst",
        ),
    log:
        "logs/{run}/card.log",
    benchmark:
        "benchmarks/{run}/card.tsv"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        # The card is the headline build's (the first candidate); the others appear in its comparisons.
        candidate=HEADLINE,
        comparison=lambda w, input: (
            f"--comparison {input.comparison[0]}" if input.comparison else ""
        ),
    shell:
        "fideval card {input.report:q} --candidate {params.candidate:q} --out {output.card:q}"
        " --html {output.results:q} {params.comparison} > {log:q} 2>&1"


rule check:
    input:
        config=local(CONFIG_FILE),
        report="reports/{run}/report.json",
    output:
        "reports/{run}/check.txt",
    log:
        "logs/{run}/check.log",
    benchmark:
        "benchmarks/{run}/check.tsv"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    shell:
        "fideval check {input.report:q} --config {input.config:q} --out {output:q} > {log:q} 2>&1"
