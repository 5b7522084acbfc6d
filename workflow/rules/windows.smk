# Stage 1: evaluation windows and their cuts, screened for overlap with the calibration data.


rule windows:
    input:
        config=local(CONFIG_FILE),
    output:
        meta="results/{run}/windows/eval-windows.json",
        index="results/{run}/windows/index.parquet",
        windows=f"results/{{run}}/windows/windows-{W}/tokens.safetensors",
        cuts=f"results/{{run}}/windows/cuts-{C}/tokens.safetensors",
    log:
        "logs/{run}/windows.log",
    benchmark:
        "benchmarks/{run}/windows.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "fideval windows {input.config:q} --out results/{wildcards.run}/windows > {log:q} 2>&1"
